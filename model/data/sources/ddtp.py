"""Debian package-description translations (DDTP), joined on Description-md5.

The private apt state fetches ``Translation-pt_BR`` and ``Translation-en``
indexes; short descriptions pair directly, long descriptions are split into
paragraphs (and list items, then sentences) only where both sides align 1:1.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

from .. import apt
from ..clean import normalize
from ..pairs import Pair
from ..segment import align_parts, split_sentences

NAME = "ddtp"
_BULLET = re.compile(r"^\s*(?:[*+\u2022-]|o(?=\s))\s+")

log = logging.getLogger(__name__)


def read_index(path: Path, lang: str) -> dict[str, tuple[str, str]]:
    """Map Description-md5 -> (short, long) for one Translation index file."""
    out: dict[str, tuple[str, str]] = {}
    for stanza in path.read_text(encoding="utf-8", errors="replace").split("\n\n"):
        parsed = _parse_stanza(stanza, lang)
        if parsed is not None:
            out[parsed[0]] = parsed[1:]
    return out


def _parse_stanza(stanza: str, lang: str) -> tuple[str, str, str] | None:
    md5, short, body = "", "", []
    in_desc = False
    for line in stanza.splitlines():
        if line.startswith("Description-md5:"):
            md5 = line.split(":", 1)[1].strip()
        elif line.startswith(f"Description-{lang}:"):
            short, in_desc = line.split(":", 1)[1].strip(), True
        elif line.startswith(" ") and in_desc:
            body.append(line[1:])
        else:
            in_desc = False
    if not md5 or not short:
        return None
    return md5, short, "\n".join(body)


def paragraphs(long_desc: str) -> list[str]:
    """Split a long description into paragraphs and list items."""
    parts: list[list[str]] = [[]]
    for line in long_desc.splitlines():
        if line.strip() == ".":
            parts.append([])
        elif _BULLET.match(line):
            parts.append([_BULLET.sub("", line)])
        else:
            parts[-1].append(line.strip())
    return [" ".join(p).strip() for p in parts if " ".join(p).strip()]


def description_pairs(en: tuple[str, str], pt: tuple[str, str]) -> list[tuple[str, str]]:
    """Aligned pairs from one (short, long) description in both languages."""
    out = [(en[0], pt[0])]
    aligned = align_parts(paragraphs(en[1]), paragraphs(pt[1]))
    for en_p, pt_p in aligned or []:
        out.extend(align_parts(split_sentences(en_p), split_sentences(pt_p)) or [(en_p, pt_p)])
    return out


def index_files(lists: Path, lang_tag: str) -> list[Path]:
    """Translation index files for ``lang_tag`` (apt escapes ``_`` as ``%5f``)."""
    escaped = lang_tag.replace("_", "%5f")
    return sorted({*lists.glob(f"*Translation-{lang_tag}"), *lists.glob(f"*Translation-{escaped}")})


def _iter_pairs(env: apt.AptEnv) -> Iterator[Pair]:
    english: dict[str, tuple[str, str]] = {}
    for path in index_files(env.lists, "en"):
        english.update(read_index(path, "en"))
    for path in index_files(env.lists, "pt_BR"):
        for md5, pt in read_index(path, "pt_BR").items():
            if md5 not in english:
                continue
            for en_s, pt_s in description_pairs(english[md5], pt):
                yield Pair(normalize(en_s, markup=False, accelerators=False),
                           normalize(pt_s, markup=False, accelerators=False), NAME, "ddtp")


def collect(env: apt.AptEnv) -> list[Pair]:
    """All unique aligned description pairs."""
    seen: set[tuple[str, str]] = set()
    out: list[Pair] = []
    for pair in _iter_pairs(env):
        if pair.en and pair.pt and (pair.en, pair.pt) not in seen:
            seen.add((pair.en, pair.pt))
            out.append(pair)
    log.info("ddtp: %d pairs", len(out))
    return out
