"""``tolk data edu``: children's educational software, its English texts and their Brazilian Portuguese translations.

The everyday sentences that the small models get wrong are about cats, beaches, grandparents and trains. The
corpus's software rarely says such things; children's software does, and people translated it:

- GCompris (`gcompris-qt-data`): about 3,600 messages, from activity instructions ("Kick the ball into the goal.")
  to the facts its quizzes ask about ("How long does it take for Saturn to make one revolution around the Sun?").
  It is a Qt program: its catalogs are Qt's compiled `.qm` files, not gettext's, so the corpus's gettext source
  never saw them.
- GCompris's vocabulary activity (its `lang.rcc`, a Qt resource file): about 1,090 everyday words, each as its
  English and Brazilian Portuguese files name it under the same voice recording ("beach.ogg": "beach" / "praia",
  "jump.ogg": "to jump" / "pular").
- Tux Paint's stamps (`tuxpaint-stamps-default`): about 950 pictures, each with a one-line description in a text
  file, the English first and then a line per language ("Grandma's old rag doll." /
  "pt_BR.utf8=Uma boneca de pano da vovó.").

Only Brazilian Portuguese is read (`pt_BR`; GCompris and Tux Paint have Portugal's `pt` as well). The pairs are
human translations, written as a train split only (`extra.train_pairs`: cleaned as the corpus is, held-out
sentences and Portugal's forms left out):

    tolk data edu --out data/edu

The `.qm` and `.rcc` readers are this module's own. A `.qm` file: a 16-byte magic number, then sections (a tag
byte and a big-endian length), the messages section holding tagged fields, each message ending with tag 1.
translate-toolkit reads `.qm` too, but refuses a whole file when one message has no source text, as GCompris's has.
An `.rcc` file: "qres", a version and the offsets of a tree of fixed-size nodes, of their names (UTF-16) and of
their data (zlib-compressed or stored; Qt 6 can write zstd, which is refused with a clear error, as Debian's
GCompris, built with Qt 5, does not use it).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from . import apt, extra
from .distill import held_out_keys
from .notice import deb_version
from .pairs import Pair

log = logging.getLogger(__name__)
QM_MAGIC = bytes.fromhex("3cb86418caef9c95cd211cbf60a1bddd")
GCOMPRIS = "gcompris-qt-data"
GCOMPRIS_QM = "usr/share/gcompris-qt/translations/gcompris_pt_BR.qm"
GCOMPRIS_LANG = "usr/share/gcompris-qt/rcc/lang.rcc"
LANG_CONTENT = "/gcompris/src/activities/lang/resource/content-{locale}.json"
STAMPS = "tuxpaint-stamps-default"
STAMPS_ROOT = "usr/share/tuxpaint/stamps"
PATTERNS = {GCOMPRIS: [f"./{GCOMPRIS_QM}", f"./{GCOMPRIS_LANG}"], STAMPS: [f"./{STAMPS_ROOT}/*.txt"]}
_MESSAGES, _END, _TRANSLATION, _SOURCE, _OBSOLETE1 = 0x69, 0x01, 0x03, 0x06, 0x05
_RCC_DIRECTORY, _RCC_ZLIB, _RCC_ZSTD = 0x02, 0x01, 0x04
_LOCALE_LINE = re.compile(r"^([a-z]{2,3}(?:_[A-Z]{2})?(?:@\w+)?)\.utf-?8=(.*)$", re.IGNORECASE)


def qm_messages(data: bytes) -> Iterator[tuple[str, list[str]]]:
    """(source text, translations) of each message of a Qt `.qm` file that has a source text. A message has more
    than one translation when it has plural forms; an unfinished one has none."""
    if data[:16] != QM_MAGIC:
        raise ValueError("not a Qt .qm file (wrong magic number)")
    pos, messages = 16, b""
    while pos + 5 <= len(data):
        tag, length = struct.unpack(">BI", data[pos:pos + 5])
        if tag == _MESSAGES:
            messages = data[pos + 5:pos + 5 + length]
        pos += 5 + length
    source: str | None = None
    translations: list[str] = []
    pos = 0
    while pos < len(messages):
        tag = messages[pos]
        pos += 1
        if tag == _END:
            if source is not None:
                yield source, translations
            source, translations = None, []
            continue
        if tag == _OBSOLETE1:  # a 4-byte number, no length
            pos += 4
            continue
        (length,) = struct.unpack(">I", messages[pos:pos + 4])
        pos += 4
        if length == 0xFFFFFFFF:  # a null string
            length = 0
        field = messages[pos:pos + length]
        pos += length
        if tag == _TRANSLATION:
            translations.append(field.decode("utf-16-be"))
        elif tag == _SOURCE:
            source = field.decode("utf-8", errors="replace")


def qm_pairs(data: bytes) -> Iterator[tuple[str, str]]:
    """(English, translation) for each translated message without plural forms."""
    for source, translations in qm_messages(data):
        if len(translations) == 1 and translations[0]:
            yield source, translations[0]


def gcompris_pairs(root: Path) -> Iterator[tuple[str, str]]:
    """(English, Brazilian Portuguese) of each translated message of an extracted `gcompris-qt-data`."""
    return qm_pairs((root / GCOMPRIS_QM).read_bytes())


def rcc_files(data: bytes) -> Iterator[tuple[str, bytes]]:
    """(path, contents) of each file in a Qt binary resource file (`rcc -binary`), paths as ":/..." without the
    colon."""
    if data[:4] != b"qres":
        raise ValueError("not a Qt resource file (no 'qres' magic)")
    version, tree, payload, names = struct.unpack(">4I", data[4:20])
    node_size = 22 if version >= 2 else 14  # version 2 added each node's modification time

    def name(offset: int) -> str:
        (length,) = struct.unpack(">H", data[names + offset:names + offset + 2])
        start = names + offset + 6  # after the length and a hash
        return data[start:start + 2 * length].decode("utf-16-be")

    def walk(index: int, path: str) -> Iterator[tuple[str, bytes]]:
        base = tree + index * node_size
        name_offset, flags = struct.unpack(">IH", data[base:base + 6])
        here = f"{path}/{name(name_offset)}" if index else ""
        if flags & _RCC_DIRECTORY:
            count, first = struct.unpack(">II", data[base + 6:base + 14])
            for child in range(first, first + count):
                yield from walk(child, here)
            return
        (offset,) = struct.unpack(">I", data[base + 10:base + 14])  # after the locale's country and language
        (size,) = struct.unpack(">I", data[payload + offset:payload + offset + 4])
        raw = data[payload + offset + 4:payload + offset + 4 + size]
        if flags & _RCC_ZSTD:
            raise ValueError(f"{here} is compressed with zstd, which this reader does not read")
        yield here, zlib.decompress(raw[4:]) if flags & _RCC_ZLIB else raw  # zlib: after the size uncompressed

    yield from walk(0, "")


def vocabulary_pairs(data: bytes, locale: str = "pt_BR") -> Iterator[tuple[str, str]]:
    """(English, `locale`'s word) for each voice recording that GCompris's vocabulary activity (`lang.rcc`) names in
    both languages, in the recordings' order."""
    files = dict(rcc_files(data))
    english = json.loads(files[LANG_CONTENT.format(locale="en")])
    other = json.loads(files[LANG_CONTENT.format(locale=locale)])
    for key in sorted(english.keys() & other.keys()):
        if english[key].strip() and other[key].strip():
            yield english[key].strip(), other[key].strip()


def gcompris_vocabulary(root: Path) -> Iterator[tuple[str, str]]:
    """(English, Brazilian Portuguese) of each word of an extracted `gcompris-qt-data`'s vocabulary activity."""
    return vocabulary_pairs((root / GCOMPRIS_LANG).read_bytes())


def stamp_description(text: str, locale: str = "pt_BR") -> tuple[str, str] | None:
    """(English, `locale`'s translation) of a Tux Paint stamp's description file, or None where it has none. The
    English is the first line (it may hold an "=", "A calculator.  6x7=42"); then come `locale.utf8=` lines."""
    lines = text.splitlines()
    if not lines or not lines[0].strip():
        return None
    for line in lines[1:]:
        found = _LOCALE_LINE.match(line.strip())
        if found and found.group(1) == locale and found.group(2).strip():
            return lines[0].strip(), found.group(2).strip()
    return None


def stamp_pairs(root: Path) -> Iterator[tuple[str, str]]:
    """(English, Brazilian Portuguese) of each stamp under an extracted `tuxpaint-stamps-default`, in path order."""
    for path in sorted((root / STAMPS_ROOT).rglob("*.txt")):
        pair = stamp_description(path.read_text(encoding="utf-8", errors="replace"))
        if pair is not None:
            yield pair


def add_arguments(p: argparse.ArgumentParser) -> None:
    extra.add_arguments(p, Path("data/edu"))


@dataclass(frozen=True)
class Part:
    """What one reader takes from one package."""

    name: str  # the pairs' source and the key in stats.json
    package: str
    read: Callable[[Path], Iterator[tuple[str, str]]]
    interface: bool  # user-interface text: markup and accelerators are stripped
    licence: str
    what: str


PARTS = (
    Part("gcompris", GCOMPRIS, gcompris_pairs, True, "GPL-3+ (GCompris)",
         "the messages of its Brazilian Portuguese catalog (gcompris_pt_BR.qm)"),
    Part("gcompris-words", GCOMPRIS, gcompris_vocabulary, False, "GPL-3+ (GCompris)",
         "the English and Brazilian Portuguese words of its vocabulary activity (lang.rcc)"),
    Part("tuxpaint-stamps", STAMPS, stamp_pairs, False, "GPL-2 (Tux Paint stamps)",
         "the English descriptions of the stamps and their Brazilian Portuguese translations (pt_BR)"),
)


def main(args: argparse.Namespace) -> int:
    """Write the pairs of GCompris and Tux Paint's stamps; returns a process exit status."""
    work, out = args.work.resolve(), args.out.resolve()
    env = apt.prepare(work / "apt")
    held = held_out_keys(args.held_out)
    kept: list[Pair] = []
    stats: dict[str, object] = {}
    notice = ["Tolk pairs from children's educational software: sources\n"]
    roots: dict[str, tuple[Path, str]] = {}  # package -> its extracted tree and version, each package once
    for package, patterns in PATTERNS.items():
        deb = apt.download(env, package)
        if deb is None:
            log.error("could not download %s", package)
            return 1
        roots[package] = apt.extract(deb, work / "extract" / package, patterns), deb_version(deb)
    for part in PARTS:
        root, version = roots[part.package]
        found = [(en, pt, part.package) for en, pt in part.read(root)]
        pairs, rejected = extra.train_pairs(found, part.name, held, markup=part.interface,
                                            accelerators=part.interface)
        kept.extend(pairs)
        stats[part.name] = {"found": len(found), "kept": len(pairs), "rejected": rejected}
        notice.append(f"{part.name}: Debian package {part.package} {version}, {part.licence}: {part.what}. "
                      "Human translations.")
    extra.write_train(out, kept, "\n".join(notice) + "\n", stats)
    log.info("wrote %s: %d pairs (%s)", out, len(kept), stats)
    return 0
