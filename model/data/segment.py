"""Splitting long aligned texts into smaller pairs where they align 1:1."""

from __future__ import annotations

import re

_PARA = re.compile(r"\n\s*\n")
_SENT = re.compile(r"(?<=[.!?:])\s+(?=[\"'(\u00ab\u201c]?[A-Z\u00c0-\u00dd0-9])")


def split_paragraphs(text: str) -> list[str]:
    """Split on blank lines; empty parts are dropped."""
    return [p.strip() for p in _PARA.split(text) if p.strip()]


def split_sentences(text: str) -> list[str]:
    """Naive sentence split after ``.!?:`` followed by a capital or digit."""
    return [s.strip() for s in _SENT.split(text) if s.strip()]


def align_parts(en_parts: list[str], pt_parts: list[str]) -> list[tuple[str, str]] | None:
    """Pair the parts when the counts agree, else ``None``."""
    if len(en_parts) != len(pt_parts) or not en_parts:
        return None
    return list(zip(en_parts, pt_parts, strict=True))


def split_aligned(en: str, pt: str, sentences: bool = True) -> list[tuple[str, str]]:
    """Split a pair into paragraph (then sentence) pairs where counts match.

    Falls back to the whole pair when paragraphs do not align; a paragraph
    whose sentences do not align stays whole.
    """
    paras = align_parts(split_paragraphs(en), split_paragraphs(pt)) or [(en, pt)]
    if not sentences:
        return paras
    out: list[tuple[str, str]] = []
    for en_p, pt_p in paras:
        out.extend(align_parts(split_sentences(en_p), split_sentences(pt_p)) or [(en_p, pt_p)])
    return out
