"""pt_BR gettext catalogs (``.mo``, plus Kodi-style ``.po``) from Debian packages.

Every curated package is downloaded, its pt_BR catalogs extracted and parsed;
packages are ranked by the number of unique translated pairs and the
``max_catalogs`` largest are kept.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .. import apt
from ..catalog import Entry, entry_pairs, parse_mo, parse_po
from ..clean import normalize
from ..pairs import Pair
from ..segment import split_aligned
from .catalog_packages import PACKAGES

NAME = "gettext"
PATTERNS = [
    "*/pt_BR/LC_MESSAGES/*.mo",
    "*/pt-BR/LC_MESSAGES/*.mo",
    "*/pt_BR/LC_MESSAGES/*.po",
    "*/resource.language.pt_br/*.po",
]

log = logging.getLogger(__name__)


def find_catalogs(root: Path) -> list[Path]:
    """All pt_BR catalog files below an extracted package tree."""
    found = [p for p in root.rglob("*") if p.suffix in (".mo", ".po") and p.is_file()]
    return sorted(p for p in found if _is_pt_br(p))


def _is_pt_br(path: Path) -> bool:
    parts = [part.lower() for part in path.parts]
    return any(part in ("pt_br", "pt-br", "resource.language.pt_br") for part in parts)


def catalog_entries(path: Path) -> list[Entry]:
    """Parse one catalog; unreadable files yield no entries."""
    try:
        return parse_mo(path) if path.suffix == ".mo" else parse_po(path)
    except (ValueError, OSError) as exc:
        log.warning("cannot parse %s: %s", path, exc)
        return []


def package_pairs(root: Path, package: str, source: str = NAME) -> list[Pair]:
    """Unique normalised pairs from every pt_BR catalog of one package."""
    seen: set[tuple[str, str]] = set()
    out: list[Pair] = []
    for path in find_catalogs(root):
        for entry in catalog_entries(path):
            for en_raw, pt_raw in entry_pairs(entry):
                for en_seg, pt_seg in split_aligned(en_raw, pt_raw, sentences=False):
                    en, pt = normalize(en_seg), normalize(pt_seg)
                    if en and pt and en != pt and (en, pt) not in seen:
                        seen.add((en, pt))
                        out.append(Pair(en, pt, source, package))
    return out


def collect(env: apt.AptEnv, work: Path, max_catalogs: int = 100,
            packages: tuple[str, ...] = PACKAGES) -> tuple[list[Pair], list[str]]:
    """Download/extract candidates, keep the ``max_catalogs`` largest.

    Returns the pairs and the names of the packages that were kept.
    """
    debs = apt.download_many(env, list(packages))
    per_package: dict[str, list[Pair]] = {}
    for name, deb in debs.items():
        root = apt.extract(deb, work / "extract" / name, PATTERNS)
        pairs = package_pairs(root, name)
        if pairs:
            per_package[name] = pairs
    ranked = sorted(per_package, key=lambda n: len(per_package[n]), reverse=True)
    kept = ranked[:max_catalogs]
    for name in ranked:
        log.info("%-32s %6d pairs%s", name, len(per_package[name]),
                 "" if name in kept else " (not kept)")
    return [p for name in kept for p in per_package[name]], kept
