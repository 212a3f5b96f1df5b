"""Firefox ESR: pt-BR language pack joined with English strings from omni.ja.

English comes from ``omni.ja`` and ``browser/omni.ja`` of the ``firefox-esr``
package (zip files), Portuguese from the ``langpack-pt-BR`` ``.xpi``; both are
keyed by the file path (locale code normalised) and the message id.
"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path

from .. import apt
from ..clean import normalize
from ..pairs import Pair
from .l10n_files import parse_ftl, parse_properties, resolve_terms, simple_terms

NAME = "firefox"
EN_PACKAGE = "firefox-esr"
PT_PACKAGE = "firefox-esr-l10n-pt-br"
PATTERNS = ["*omni.ja", "*.xpi"]

log = logging.getLogger(__name__)


def read_archive(path: Path, prefix: str, locale: str) -> dict[str, dict[str, str]]:
    """Parse every .ftl/.properties in a zip; keys are en-US-normalised paths."""
    files: dict[str, dict[str, str]] = {}
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            if not name.endswith((".ftl", ".properties")) or locale not in name:
                continue
            text = archive.read(name).decode("utf-8", errors="replace")
            key = prefix + name.replace(locale, "en-US")
            files[key] = parse_ftl(text) if name.endswith(".ftl") else parse_properties(text)
    return files


def _resolve(files: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    terms: dict[str, str] = {}
    for path, messages in files.items():
        if path.endswith(".ftl"):
            terms.update(simple_terms(messages))
    return {p: resolve_terms(m, terms) if p.endswith(".ftl") else m for p, m in files.items()}


def join(en: dict[str, dict[str, str]], pt: dict[str, dict[str, str]]) -> list[tuple[str, str]]:
    """Pairs for message ids present in the same file on both sides."""
    out: list[tuple[str, str]] = []
    for path, en_msgs in en.items():
        pt_msgs = pt.get(path, {})
        for key, en_value in en_msgs.items():
            if key in pt_msgs:
                out.extend(_plural_split(en_value, pt_msgs[key], path))
    return out


def _plural_split(en: str, pt: str, path: str) -> list[tuple[str, str]]:
    if path.endswith(".properties") and ";" in en:
        en_parts, pt_parts = en.split(";"), pt.split(";")
        if len(en_parts) == len(pt_parts):
            return list(zip(en_parts, pt_parts, strict=True))
    return [(en, pt)]


def collect(env: apt.AptEnv, work: Path) -> list[Pair]:
    """All unique Firefox pairs."""
    debs = apt.download_many(env, [EN_PACKAGE, PT_PACKAGE])
    if len(debs) < 2:
        log.warning("firefox packages unavailable; skipped")
        return []
    en_root = apt.extract(debs[EN_PACKAGE], work / "extract" / EN_PACKAGE, PATTERNS)
    pt_root = apt.extract(debs[PT_PACKAGE], work / "extract" / PT_PACKAGE, PATTERNS)
    base = en_root / "usr/lib/firefox-esr"
    en = {**read_archive(base / "omni.ja", "", "en-US"),
          **read_archive(base / "browser/omni.ja", "browser/", "en-US")}
    pt: dict[str, dict[str, str]] = {}
    for xpi in sorted(pt_root.rglob("langpack-pt-BR*.xpi")):
        pt.update(read_archive(xpi, "", "pt-BR"))
    seen: set[tuple[str, str]] = set()
    out: list[Pair] = []
    for en_raw, pt_raw in join(_resolve(en), _resolve(pt)):
        en_s, pt_s = normalize(en_raw), normalize(pt_raw)
        if en_s and pt_s and en_s != pt_s and (en_s, pt_s) not in seen:
            seen.add((en_s, pt_s))
            out.append(Pair(en_s, pt_s, NAME, PT_PACKAGE))
    log.info("firefox: %d pairs", len(out))
    return out
