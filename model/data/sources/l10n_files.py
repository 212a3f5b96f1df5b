"""Parsers for Mozilla localisation files: Fluent (``.ftl``) and ``.properties``.

Only simple messages are kept: Fluent values with select expressions are
skipped, and references to simple terms (``{ -brand-short-name }``) are
resolved with the locale's own term values.
"""

from __future__ import annotations

import re

_FTL_ENTRY = re.compile(r"^(-?[A-Za-z][\w-]*)\s*=\s?(.*)$")
_FTL_ATTR = re.compile(r"^\s+\.([\w-]+)\s*=\s?(.*)$")
_TERM_REF = re.compile(r"\{\s*-([\w-]+)(?:\.[\w-]+)?(?:\([^)]*\))?\s*\}")
_LITERAL = re.compile(r"\{\s*\"([^\"]*)\"\s*\}")
_UNICODE_ESC = re.compile(r"\\u([0-9a-fA-F]{4})")


def parse_ftl(text: str) -> dict[str, str]:
    """Map ``id`` / ``id.attr`` (terms as ``-id``) to raw pattern text."""
    out: dict[str, str] = {}
    current: str | None = None
    msg_id: str | None = None
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            current = None if not line.strip() else current
            continue
        entry = _FTL_ENTRY.match(line)
        attr = _FTL_ATTR.match(line)
        if entry:
            msg_id = current = entry.group(1)
            out[current] = entry.group(2).strip()
        elif attr and msg_id is not None:
            current = f"{msg_id}.{attr.group(1)}"
            out[current] = attr.group(2).strip()
        elif line.startswith((" ", "\t")) and current is not None:
            out[current] = (out[current] + "\n" + line.strip()).strip()
    return {k: v for k, v in out.items() if v}


def resolve_terms(messages: dict[str, str], terms: dict[str, str]) -> dict[str, str]:
    """Replace simple term references and string literals; drop select expressions."""
    out: dict[str, str] = {}
    for key, value in messages.items():
        if key.startswith("-") or "->" in value:
            continue
        value = _TERM_REF.sub(lambda m: terms.get("-" + m.group(1), m.group(0)), value)
        value = _LITERAL.sub(lambda m: m.group(1), value)
        out[key] = value
    return out


def simple_terms(messages: dict[str, str]) -> dict[str, str]:
    """Terms whose value is plain text (no placeables)."""
    return {k: v for k, v in messages.items()
            if k.startswith("-") and "." not in k and "{" not in v}


def parse_properties(text: str) -> dict[str, str]:
    """Parse a Java-style ``.properties`` file (continuations, ``\\uXXXX``)."""
    out: dict[str, str] = {}
    logical: list[str] = []
    for raw in text.splitlines():
        line = raw.strip() if not logical else raw.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical.append(line[:-1])
            continue
        logical.append(line)
        key, value = _split_property("".join(logical))
        logical = []
        if key:
            out[key] = value
    return out


def _split_property(line: str) -> tuple[str, str]:
    match = re.match(r"^((?:\\.|[^=:\s\\])+)\s*[=:\s]\s*(.*)$", line)
    if not match:
        return "", ""
    value = _UNICODE_ESC.sub(lambda m: chr(int(m.group(1), 16)), match.group(2))
    value = value.replace("\\n", "\n").replace("\\t", " ").replace("\\'", "'")
    return match.group(1), value.replace("\\\\", "\\")
