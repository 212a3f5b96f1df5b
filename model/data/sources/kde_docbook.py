"""KDE's application handbooks (DocBook), English against Brazilian Portuguese, aligned section by section.

KDE translates a handbook through a catalogue of its blocks (po2xml), so a translated `index.docbook` keeps the
English one's structure: the same sections (with the same ids), paragraphs and titles in the same order. A
translation made from an older English handbook differs in the sections that changed since; those sections are
skipped, the others pair block by block. Entities (`&kde;`, `&LMB;`, `&Ctrl;`, ...) are expanded from kdoctools'
own tables for each language (Debian's `kdoctools5`); a block with an entity neither table knows is skipped.
"""

from __future__ import annotations

import logging
import re
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

from .. import apt
from ..clean import collapse_ws
from ..pairs import Pair, unique_pairs
from ..segment import split_aligned

NAME = "kde"
DOC_ROOT = "usr/share/doc/HTML"
ENTITIES_PACKAGE = "kdoctools5"
CUSTOMIZATION = "usr/share/kf5/kdoctools/customization"
# Debian packages that carry KDE handbooks under usr/share/doc/HTML/{en,pt_BR}; one without a pt_BR handbook
# contributes nothing.
PACKAGES = (
    "okular", "dolphin", "konsole", "kate5-data", "kwrite", "ark", "gwenview", "spectacle", "kcalc", "kcharselect",
    "kfind", "kompare", "kolourpaint", "kmix", "juk", "dragonplayer", "kwalletmanager", "khelpcenter",
    "systemsettings", "kinfocenter", "plasma-desktop-data", "kmplot", "kbruch", "kanagram", "khangman", "blinken",
    "ktouch", "kwordquiz", "parley", "kturtle", "kig", "kgeography-data", "kalzium-data", "marble-data", "step",
    "cantor", "kpat", "kmines", "ksudoku", "knights", "kblocks", "kgoldrunner", "palapeli", "kdiamond", "bovo",
    "kapman", "kollision", "kshisen", "kmahjongg", "kreversi", "kfourinline", "katomic", "kbreakout", "killbots",
    "klines", "knetwalk", "kolf", "konquest", "ksquares", "ktuberling", "lskat", "granatier", "picmi", "kigo",
    "kblackbox", "knavalbattle", "kbounce", "kjumpingcube", "kiriki", "kspaceduel", "ksnakeduel", "klickety",
    "skrooge-common", "kstars-data", "k3b-i18n", "kdenlive-data", "kmail", "korganizer", "kaddressbook",
    "akregator", "knotes", "kgpg", "kleopatra", "konqueror", "krdc", "krfb", "kget", "kdf", "ksystemlog", "sweeper",
    "filelight", "kcron", "partitionmanager", "kmouth", "kmag", "kmousetool", "kontact", "kdepim-addons",
)
LANGUAGES = {"en": "en", "pt_BR": "pt-BR"}  # handbook folder -> kdoctools customization folder
SECTIONS = frozenset(("book", "chapter", "appendix", "preface", "sect1", "sect2", "sect3", "sect4", "section",
                      "glossentry", "varlistentry", "qandaentry"))
BLOCKS = frozenset(("para", "simpara", "title", "term"))
# what is not prose (code, commands, images): a block holding one is kept in the sequence but not paired
UNPAIRED = frozenset(("screen", "programlisting", "synopsis", "literallayout", "inlinemediaobject", "mediaobject",
                      "cmdsynopsis", "funcsynopsis", "address"))
IGNORED = frozenset(("indexterm", "remark", "footnote"))  # inside a block: left out of its text
_DECLARATION = re.compile(r"""<!ENTITY\s+([\w.-]+)\s+(?:"([^"]*)"|'([^']*)')\s*>""", re.S)
_REFERENCE = re.compile(r"&([\w.-]+);")
_DOCTYPE = re.compile(r"<!DOCTYPE[^\[>]*(?:\[.*?\]\s*)?>", re.S)
_XML_ENTITIES = frozenset(("amp", "lt", "gt", "quot", "apos"))
UNKNOWN = "\ue000"  # stands for an entity no table knows

log = logging.getLogger(__name__)


def declarations(text: str) -> dict[str, str]:
    """`<!ENTITY name "value">` declarations of an entities file or a document's internal subset."""
    return {m[1]: m[2] if m[2] is not None else m[3] for m in _DECLARATION.finditer(text)}


def entity_table(customization: Path, language: str) -> dict[str, str]:
    """kdoctools' entities for one customization language (en, pt-BR, ...): general ones, then the language's."""
    table: dict[str, str] = {}
    for path in (customization / "entities" / "general.entities", customization / "en" / "user.entities",
                 customization / language / "user.entities", customization / language / "strings.entities"):
        if path.is_file():
            table.update(declarations(path.read_text(encoding="utf-8", errors="replace")))
    return table


def expand(text: str, table: dict[str, str], passes: int = 6) -> str:
    """Replace entity references from `table` (values may refer to others); unknown ones become UNKNOWN."""
    def one(match: re.Match[str]) -> str:
        name = match[1]
        if name in _XML_ENTITIES:
            return match[0]
        return table.get(name, UNKNOWN)

    for _ in range(passes):
        expanded = _REFERENCE.sub(one, text)
        if expanded == text:
            break
        text = expanded
    return text


def document_blocks(path: Path, table: dict[str, str]) -> dict[str, list[tuple[str, str | None]]] | None:
    """A handbook's blocks, grouped by the id of the section they are in: (tag, text), text None where the block
    is not prose. None if the document does not parse."""
    try:
        raw = path.read_text(encoding="utf-8", errors="replace")
        local = {**table, **declarations(raw.split("]>", 1)[0] if "<!DOCTYPE" in raw else "")}
        root = ET.fromstring(expand(_DOCTYPE.sub("", raw, count=1), local))
    except (ET.ParseError, OSError):
        return None
    out: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    _walk(root, root.get("id", ""), out)
    return out


def _walk(element: ET.Element, section: str, out: dict[str, list[tuple[str, str | None]]]) -> None:
    for child in element:
        if not isinstance(child.tag, str) or child.tag in IGNORED:
            continue
        if child.tag in SECTIONS:
            _walk(child, child.get("id") or section, out)
        elif child.tag in BLOCKS:
            out[section].append((child.tag, _text(child)))
            if any(inner.tag in BLOCKS for inner in child.iter() if inner is not child):
                _walk(child, section, out)  # (a paragraph holding a list of paragraphs)
        else:
            _walk(child, section, out)


def _text(block: ET.Element) -> str | None:
    parts: list[str] = []

    def visit(element: ET.Element) -> bool:
        if element.tag in UNPAIRED or (element is not block and element.tag in BLOCKS):
            return False
        parts.append(element.text or "")
        for child in element:
            if child.tag not in IGNORED and not visit(child):
                return False
            parts.append(child.tail or "")
        return True

    if not visit(block):
        return None
    text = collapse_ws("".join(parts))
    return text if text and UNKNOWN not in text else None


def aligned_blocks(en: dict[str, list[tuple[str, str | None]]],
                   pt: dict[str, list[tuple[str, str | None]]], stats: Counter[str]) -> Iterator[tuple[str, str]]:
    """The (English, Portuguese) text of each block of the sections both handbooks have with the same structure."""
    for section, en_blocks in en.items():
        pt_blocks = pt.get(section)
        if pt_blocks is None or [t for t, _ in en_blocks] != [t for t, _ in pt_blocks]:
            stats["sections_misaligned"] += 1
            continue
        stats["sections"] += 1
        for (_, e), (_, p) in zip(en_blocks, pt_blocks, strict=True):
            if e is not None and p is not None:
                yield e, p


def handbook_pairs(root: Path, tables: dict[str, dict[str, str]], stats: Counter[str]) -> Iterator[tuple[str, str]]:
    """Sentence pairs of every handbook under root that has a pt_BR translation."""
    docs = root / DOC_ROOT
    for en_path in sorted((docs / "en").glob("**/*.docbook")):
        pt_path = docs / "pt_BR" / en_path.relative_to(docs / "en")
        if not pt_path.is_file():
            continue
        en, pt = document_blocks(en_path, tables["en"]), document_blocks(pt_path, tables["pt_BR"])
        if en is None or pt is None:
            stats["documents_unparsed"] += 1
            continue
        stats["documents"] += 1
        for en_text, pt_text in aligned_blocks(en, pt, stats):
            yield from split_aligned(en_text, pt_text)


def collect(env: apt.AptEnv, work: Path) -> tuple[list[Pair], list[str]]:
    """Unique pairs from every package's handbooks, and the packages that gave any (kdoctools5 among them when
    any did: its entity tables)."""
    tools = apt.download(env, ENTITIES_PACKAGE)
    if tools is None:
        log.warning("kde: %s not downloaded; no handbooks", ENTITIES_PACKAGE)
        return [], []
    custom = apt.extract(tools, work / "extract" / ENTITIES_PACKAGE, [f"./{CUSTOMIZATION}/*"]) / CUSTOMIZATION
    tables = {folder: entity_table(custom, language) for folder, language in LANGUAGES.items()}
    debs = apt.download_many(env, list(PACKAGES))
    stats: Counter[str] = Counter()
    patterns = [f"./{DOC_ROOT}/en/*.docbook", f"./{DOC_ROOT}/pt_BR/*.docbook"]
    out, used = unique_pairs(NAME, ((name, handbook_pairs(apt.extract(deb, work / "extract" / f"kde-{name}", patterns),
                                                          tables, stats)) for name, deb in debs.items()))
    if used:
        used.append(ENTITIES_PACKAGE)
    log.info("kde: %d pairs from %d packages (%s)", len(out), len(used), dict(stats))
    return out, used
