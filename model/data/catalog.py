"""Readers for gettext catalogs: binary ``.mo`` and text ``.po`` files.

Both return :class:`Entry` objects; the header entry (empty msgid) is dropped,
and ``.po`` entries marked fuzzy or left untranslated are skipped.
"""

from __future__ import annotations

import ast
import struct
from dataclasses import dataclass
from pathlib import Path

MO_MAGIC_LE = 0x950412DE
MO_MAGIC_BE = 0xDE120495


@dataclass(frozen=True)
class Entry:
    """One catalog message: singular/plural source and its translations."""

    msgid: str
    msgstr: tuple[str, ...]
    msgid_plural: str = ""
    msgctxt: str = ""


def parse_mo_bytes(data: bytes) -> list[Entry]:
    """Parse the contents of a GNU ``.mo`` file."""
    if len(data) < 28:
        raise ValueError("file too short for a .mo catalog")
    magic = struct.unpack("<I", data[:4])[0]
    if magic == MO_MAGIC_LE:
        order = "<"
    elif magic == MO_MAGIC_BE:
        order = ">"
    else:
        raise ValueError("bad .mo magic number")
    _rev, count, orig_off, trans_off = struct.unpack(order + "4I", data[4:20])
    entries = []
    for i in range(count):
        olen, opos = struct.unpack(order + "2I", data[orig_off + 8 * i: orig_off + 8 * i + 8])
        tlen, tpos = struct.unpack(order + "2I", data[trans_off + 8 * i: trans_off + 8 * i + 8])
        orig = data[opos: opos + olen].decode("utf-8", errors="replace")
        trans = data[tpos: tpos + tlen].decode("utf-8", errors="replace")
        entry = _make_entry(orig, trans)
        if entry is not None:
            entries.append(entry)
    return entries


def _make_entry(orig: str, trans: str) -> Entry | None:
    ctxt = ""
    if "\x04" in orig:
        ctxt, _, orig = orig.partition("\x04")
    if not orig:
        return None
    singular, _, plural = orig.partition("\x00")
    return Entry(singular, tuple(trans.split("\x00")), plural, ctxt)


def parse_mo(path: Path) -> list[Entry]:
    """Parse a ``.mo`` file from disk."""
    return parse_mo_bytes(path.read_bytes())


def parse_po_text(text: str) -> list[Entry]:
    """Parse ``.po`` text; skips fuzzy, obsolete, untranslated and header entries."""
    entries: list[Entry] = []
    for block in text.split("\n\n"):
        entry = _parse_po_block(block)
        if entry is not None:
            entries.append(entry)
    return entries


def _parse_po_block(block: str) -> Entry | None:
    fields: dict[str, str] = {}
    key = None
    fuzzy = False
    for raw in block.splitlines():
        line = raw.strip()
        if line.startswith("#,") and "fuzzy" in line:
            fuzzy = True
        if not line or line.startswith("#"):
            continue
        if line.startswith('"'):
            if key is not None:
                fields[key] += _unquote(line)
            continue
        key, _, rest = line.partition(" ")
        fields[key] = _unquote(rest.strip())
    msgid = fields.get("msgid", "")
    if fuzzy or not msgid:
        return None
    if "msgstr" in fields:
        strs: tuple[str, ...] = (fields["msgstr"],)
    else:
        strs = tuple(fields[k] for k in sorted(fields) if k.startswith("msgstr["))
    if not any(strs):
        return None
    return Entry(msgid, strs, fields.get("msgid_plural", ""), fields.get("msgctxt", ""))


def _unquote(token: str) -> str:
    if len(token) < 2 or not token.startswith('"'):
        return ""
    try:
        value = ast.literal_eval(token)
    except (ValueError, SyntaxError):
        return token[1:-1]
    return value if isinstance(value, str) else ""


def parse_po(path: Path) -> list[Entry]:
    """Parse a ``.po`` file from disk."""
    return parse_po_text(path.read_text(encoding="utf-8", errors="replace"))


def entry_pairs(entry: Entry) -> list[tuple[str, str]]:
    """Turn an entry into (English, Portuguese) pairs.

    Singular pairs with ``msgstr[0]``; for plurals, the plural form pairs with
    ``msgstr[1]`` (pt_BR has two forms).  Empty translations are dropped.
    """
    pairs: list[tuple[str, str]] = []
    if entry.msgstr and entry.msgstr[0]:
        pairs.append((entry.msgid, entry.msgstr[0]))
    if entry.msgid_plural and len(entry.msgstr) > 1 and entry.msgstr[1]:
        pairs.append((entry.msgid_plural, entry.msgstr[1]))
    return pairs
