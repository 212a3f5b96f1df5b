"""``tolk data edu``: children's educational software, its English texts and their Brazilian Portuguese translations.

The everyday sentences that the small models get wrong are about cats, beaches, grandparents and trains. The
corpus's software rarely says such things; children's software does, and people translated it:

- GCompris (`gcompris-qt-data`): about 3,600 messages, from activity instructions ("Kick the ball into the goal.")
  to the facts its quizzes ask about ("How long does it take for Saturn to make one revolution around the Sun?").
  It is a Qt program: its catalogs are Qt's compiled `.qm` files, not gettext's, so the corpus's gettext source
  never saw them.
- Tux Paint's stamps (`tuxpaint-stamps-default`): about 950 pictures, each with a one-line description in a text
  file, the English first and then a line per language ("Grandma's old rag doll." /
  "pt_BR.utf8=Uma boneca de pano da vovó.").

Only Brazilian Portuguese is read (`pt_BR`; GCompris and Tux Paint have Portugal's `pt` as well). The pairs are
human translations, written as a train split only (`extra.train_pairs`: cleaned as the corpus is, held-out
sentences and Portugal's forms left out):

    tolk data edu --out data/edu

The `.qm` reader is this module's own. Its format: a 16-byte magic number, then sections (a tag byte and a
big-endian length), the messages section holding tagged fields, each message ending with tag 1. translate-toolkit
reads `.qm` too, but refuses a whole file when one message has no source text, as GCompris's has.
"""

from __future__ import annotations

import argparse
import logging
import re
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

from . import apt, extra
from .distill import HELD_OUT, held_out_keys
from .notice import deb_version
from .pairs import Pair

log = logging.getLogger(__name__)
QM_MAGIC = bytes.fromhex("3cb86418caef9c95cd211cbf60a1bddd")
GCOMPRIS = "gcompris-qt-data"
GCOMPRIS_QM = "usr/share/gcompris-qt/translations/gcompris_pt_BR.qm"
STAMPS = "tuxpaint-stamps-default"
STAMPS_ROOT = "usr/share/tuxpaint/stamps"
LICENCES = {GCOMPRIS: "GPL-3+ (GCompris)", STAMPS: "GPL-2 (Tux Paint stamps)"}
_MESSAGES, _END, _TRANSLATION, _SOURCE, _OBSOLETE1 = 0x69, 0x01, 0x03, 0x06, 0x05
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
    p.add_argument("--out", type=Path, default=Path("data/edu"))
    p.add_argument("--work", type=Path, default=Path("data/work"), help="downloads and extracted packages")
    p.add_argument("--held-out", type=Path, nargs="*", default=[Path(p) for p in HELD_OUT],
                   help="files (either language) whose sentences must not be trained on (missing files are skipped)")


def main(args: argparse.Namespace) -> int:
    """Write the pairs of GCompris and Tux Paint's stamps; returns a process exit status."""
    work, out = args.work.resolve(), args.out.resolve()
    env = apt.prepare(work / "apt")
    held = held_out_keys(args.held_out)
    kept: list[Pair] = []
    stats: dict[str, object] = {}
    notice = ["Tolk pairs from children's educational software: sources\n"]
    readers: list[tuple[str, str, Callable[[Path], Iterator[tuple[str, str]]]]] = [
        (GCOMPRIS, f"./{GCOMPRIS_QM}", gcompris_pairs), (STAMPS, f"./{STAMPS_ROOT}/*.txt", stamp_pairs)]
    for package, pattern, read in readers:
        deb = apt.download(env, package)
        if deb is None:
            log.error("could not download %s", package)
            return 1
        found = [(en, pt, package) for en, pt in read(apt.extract(deb, work / "extract" / package, [pattern]))]
        pairs, rejected = extra.train_pairs(found, package, held, markup=package == GCOMPRIS,
                                            accelerators=package == GCOMPRIS)
        kept.extend(pairs)
        stats[package] = {"found": len(found), "kept": len(pairs), "rejected": rejected}
        notice.append(f"{package}: Debian package {package} {deb_version(deb)}, {LICENCES[package]}. The English "
                      "texts and their Brazilian Portuguese translations (pt_BR). Human translations.")
    extra.write_train(out, kept, "\n".join(notice) + "\n", stats)
    log.info("wrote %s: %d pairs (%s)", out, len(kept), stats)
    return 0
