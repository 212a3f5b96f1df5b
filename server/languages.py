"""Language codes as clients send them, matched to the languages of the served models.

Clients name a language in many ways: `pt`, `pt-BR`, `pt_BR`, ISO 639-2/3 `por`, case aside, and LibreTranslate's
clients `pb` (Argos's code for Brazilian Portuguese). langcodes standardises the tag and measures how far two tags
are apart; a request finds the served language nearest to it within langcodes' default distance (a regional variant
of the same language, `pt-PT` or `pt-BR` for `pt`, but never another language).
"""

from __future__ import annotations

from collections.abc import Iterable

import langcodes

ALIASES = {"pb": "pt-BR"}  # LibreTranslate / Argos


def standard(code: str) -> str:
    """A client's code as a standard tag (`pt_BR` -> `pt-BR`, `por` -> `pt`); the code itself if it is not one."""
    code = ALIASES.get(code.lower(), code).replace("_", "-")
    try:
        return str(langcodes.standardize_tag(code))
    except ValueError:
        return code


def match(code: str, served: Iterable[str]) -> str | None:
    """The served language that a client's code means, or None."""
    served = sorted(set(served))
    tag = standard(code)
    if tag in served:
        return tag
    try:
        found = langcodes.closest_supported_match(tag, served)
    except ValueError:
        return None
    return str(found) if found is not None else None
