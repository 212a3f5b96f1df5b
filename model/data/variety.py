"""European Portuguese in text meant to be Brazilian: forms used only in Portugal.

The Firefox Translations en-pt model that writes `tolk data distill`'s Portuguese was trained on both varieties, and
now and then writes Portugal's: "comboio" for "trem", "pequeno-almoço" for "café da manhã", "Tem estado a chover"
for "Está chovendo". A model trained on those pairs learns both. `european_form` finds such a form, so that
distillation can leave the pair out. The list holds words that Brazil does not use in any sense (not "rato", a
mouse in Portugal and a rat in Brazil), the spellings that differ ("facto", "registo", "económico"), and Portugal's
progressive, "estar a" with an infinitive, where Brazil uses the gerund.
"""

from __future__ import annotations

import re
from collections import Counter

from .pairs import Pair

_WORDS = (
    # vocabulary
    "ficheiros?", "ecrãs?", "utilizador(?:es|as?)?", "autocarros?", "comboios?", "telemóve(?:l|is)",
    "pequenos?-almoços?", "casas? de banho", "raparigas?", "equipas?", "frigoríficos?", "desportos?",
    "desportiv[oa]s?", "guarda-redes", "relvados?", "montras?", "carrinhas?", "portagens?", "sandes",
    "fatos? de banho",
    # spelling
    "factos?", "contactos?", "contactar", "registos?", "receção", "acções", "acção", "direcção",
    "actual", "actualmente", "actualizar", "actualização", "óptimos?", "óptimas?", "económic[oa]s?",
    "académic[oa]s?", "fenómenos?", "anónim[oa]s?", "electrónic[oa]s?", "eletrónic[oa]s?", "telefónic[oa]s?",
    "géneros?", "ténis", "bebés?", "polémic[oa]s?", "António", "Vénus", "cómod[oa]s?",
)
_PROGRESSIVE = (r"(?:estou|estás|está|estado|estamos|estão|estava|estavas|estávamos|estavam|esteve|estiveram|estar|"
                r"estará|estarão|estaria|estariam|esteja|estejam|estivesse|estivessem|estando|ficou|fica|ficam) "
                r"a (?!par\b)[a-zà-ú]+(?:ar|er|ir)\b")
_PATTERN = re.compile(rf"\b(?:{'|'.join(_WORDS)})\b|\b{_PROGRESSIVE}", re.IGNORECASE)


def european_form(text: str) -> str | None:
    """The first form of Portugal's Portuguese in `text`, or None."""
    found = _PATTERN.search(text)
    return found.group(0) if found else None


def brazilian_only(pairs: list[Pair], reasons: Counter[str]) -> list[Pair]:
    """The pairs whose Portuguese has no form of Portugal's; how many were left out is counted in `reasons` as
    "european"."""
    kept = [p for p in pairs if european_form(p.pt) is None]
    if len(kept) < len(pairs):
        reasons["european"] += len(pairs) - len(kept)
    return kept
