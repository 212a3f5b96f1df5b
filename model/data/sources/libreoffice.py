"""LibreOffice: UI catalogs (pt_BR ``.mo``) and help pages aligned by id."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from .. import apt
from ..clean import normalize
from ..pairs import Pair
from ..segment import split_aligned
from .gettext_catalogs import package_pairs
from .help_html import html_paragraphs

NAME = "libreoffice"
UI_PACKAGE = "libreoffice-l10n-pt-br"
HELP_PT = "libreoffice-help-pt-br"
HELP_EN = "libreoffice-help-en-us"
PACKAGES = (UI_PACKAGE, HELP_PT, HELP_EN)
HELP_ROOT = "usr/share/libreoffice/help"

log = logging.getLogger(__name__)


def help_pairs(en_root: Path, pt_root: Path) -> Iterator[tuple[str, str, str]]:
    """Yield (relative path, English, Portuguese) for ids present in both trees."""
    for en_file in sorted(en_root.rglob("*.html")):
        rel = en_file.relative_to(en_root)
        pt_file = pt_root / rel
        if not pt_file.exists():
            continue
        pt_paras = html_paragraphs(pt_file)
        for ident, en_text in html_paragraphs(en_file).items():
            if ident in pt_paras:
                yield str(rel), en_text, pt_paras[ident]


def collect(env: apt.AptEnv, work: Path) -> list[Pair]:
    """UI and help pairs (unique per package)."""
    debs = apt.download_many(env, list(PACKAGES))
    roots = {name: apt.extract(deb, work / "extract" / name, None) for name, deb in debs.items()}
    out: list[Pair] = []
    if UI_PACKAGE in roots:
        out += package_pairs(roots[UI_PACKAGE], UI_PACKAGE, NAME)
    if HELP_PT in roots and HELP_EN in roots:
        seen: set[tuple[str, str]] = set()
        en_root = roots[HELP_EN] / HELP_ROOT / "en-US"
        pt_root = roots[HELP_PT] / HELP_ROOT / "pt-BR"
        for _rel, en_raw, pt_raw in help_pairs(en_root, pt_root):
            en_par = normalize(en_raw, accelerators=False)
            pt_par = normalize(pt_raw, accelerators=False)
            for en, pt in split_aligned(en_par, pt_par):
                if en and pt and en != pt and (en, pt) not in seen:
                    seen.add((en, pt))
                    out.append(Pair(en, pt, NAME, HELP_PT))
    log.info("libreoffice: %d pairs", len(out))
    return out
