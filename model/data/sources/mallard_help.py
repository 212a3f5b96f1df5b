"""User help written in Mallard (GNOME's desktop help and its applications' help), aligned block by block.

A translated page is made by itstool from the English page and a catalogue of its blocks, so it keeps the English
page's structure: the same titles, paragraphs and list items in the same order. Pages whose block sequences differ
(an outdated translation) are skipped whole. This is the corpus's prose: full sentences that explain and instruct,
where the rest of the corpus is mostly interface strings.
"""

from __future__ import annotations

import logging
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from .. import apt
from ..clean import collapse_ws
from ..pairs import Pair, unique_pairs
from ..segment import split_aligned

NAME = "mallard"
HELP_ROOT = "usr/share/help"
# Debian packages that carry Mallard help under usr/share/help/{C,pt_BR}; those without a pt_BR translation of a
# page contribute nothing for it.
PACKAGES = (
    "gnome-user-docs", "evince-common", "gedit-common", "eog", "baobab", "gnome-terminal-data",
    "gnome-calculator", "file-roller", "cheese-common", "totem-common", "gnome-system-monitor", "simple-scan",
    "gnome-disk-utility", "rhythmbox-data", "zenity-common", "gnome-maps", "gnome-logs", "gnome-font-viewer",
    "seahorse", "gnome-clocks", "gnome-weather", "gnome-contacts", "gnome-boxes", "gnome-sound-recorder",
    "gnome-klotski", "aisleriot", "gnome-mines", "gnome-sudoku", "quadrapassel", "iagno", "five-or-more",
    "four-in-a-row", "gnome-chess", "tali", "lightsoff", "swell-foop", "gnome-robots", "gnome-nibbles",
    "gnome-mahjongg", "gnome-tetravex", "hitori", "gnome-taquin", "gitg", "accerciser", "orca", "brasero-common",
    "pitivi", "shotwell-common",
)
MALLARD = "{http://projectmallard.org/1.0/}"
BLOCKS = frozenset(MALLARD + t for t in ("title", "subtitle", "desc", "p"))
# never translated text, or not shown: credits, revisions, code, editorial comments
SKIPPED = frozenset(MALLARD + t for t in ("credit", "revision", "code", "screen", "comment", "synopsis", "license"))

log = logging.getLogger(__name__)


def page_blocks(path: Path) -> list[tuple[str, str | None]] | None:
    """A page's translatable blocks in document order: (tag, text), text None where the block cannot stand alone as
    a sentence (a link whose text Mallard fills in from its target, an inline image). None if the page does not
    parse."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError):
        return None
    out: list[tuple[str, str | None]] = []
    _walk(root, out)
    return out


def _walk(element: ET.Element, out: list[tuple[str, str | None]]) -> None:
    for child in element:
        if child.tag in SKIPPED:
            continue
        if child.tag in BLOCKS:
            out.append((child.tag.removeprefix(MALLARD), _text(child)))
        else:
            _walk(child, out)


def _text(block: ET.Element) -> str | None:
    for inline in block.iter():
        if inline.tag in SKIPPED or inline.tag == MALLARD + "media":
            return None
        if inline.tag == MALLARD + "link" and not "".join(inline.itertext()).strip():
            return None  # Mallard writes the target's title here: the sentence has a hole on both sides
    text = collapse_ws("".join(block.itertext()))
    return text or None


def aligned_blocks(en_page: Path, pt_page: Path) -> list[tuple[str, str]] | None:
    """The (English, Portuguese) text of each block two pages share, or None when their structures differ."""
    en, pt = page_blocks(en_page), page_blocks(pt_page)
    if en is None or pt is None or [tag for tag, _ in en] != [tag for tag, _ in pt]:
        return None
    return [(e, p) for (_, e), (_, p) in zip(en, pt, strict=True) if e is not None and p is not None]


def help_pairs(root: Path, stats: Counter[str]) -> Iterator[tuple[str, str]]:
    """Block pairs of every document under root/usr/share/help that has a pt_BR translation, sentence pairs where
    a block's sentences align one to one."""
    help_dir = root / HELP_ROOT
    for en_page in sorted((help_dir / "C").glob("*/*.page")):
        pt_page = help_dir / "pt_BR" / en_page.parent.name / en_page.name
        if not pt_page.exists():
            continue
        blocks = aligned_blocks(en_page, pt_page)
        stats["pages" if blocks is not None else "pages_misaligned"] += 1
        for en, pt in blocks or []:
            yield from split_aligned(en, pt)


def collect(env: apt.AptEnv, work: Path) -> tuple[list[Pair], list[str]]:
    """Unique pairs from every package's help, and the packages that gave any."""
    debs = apt.download_many(env, list(PACKAGES))
    stats: Counter[str] = Counter()
    patterns = [f"./{HELP_ROOT}/C/*", f"./{HELP_ROOT}/pt_BR/*"]
    out, used = unique_pairs(NAME, ((name, help_pairs(apt.extract(deb, work / "extract" / name, patterns), stats))
                                    for name, deb in debs.items()))
    log.info("mallard: %d pairs from %d packages (%d pages aligned, %d skipped: structures differ)", len(out),
             len(used), stats["pages"], stats["pages_misaligned"])
    return out, used
