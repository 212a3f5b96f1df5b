"""gettext catalogs (.po, .pot): the untranslated messages are translated; everything else is kept.

Read with polib. A message already translated (fuzzy or not), the header and obsolete messages are kept as they are.
A message with a plural gets as many forms as the target language has (`nplurals` of its `Plural-Forms`): the
first from `msgid`, the others from `msgid_plural` (a language with one form takes `msgid_plural`). The language is
the catalog's `Language` header; without one the catalog's own `Plural-Forms` is kept, and a catalog with neither
gets `nplurals=2; plural=(n != 1);` (English-like, Portuguese: the shipped model's target).

Machine translations are marked `fuzzy`: gettext's own mark for a translation nobody has checked. msgfmt leaves
them out of the compiled catalog until a translator removes the mark (or compiles with `--use-fuzzy`), so an
unreviewed machine translation never ships by accident. The message's other flags (`c-format`, ...) stay.

Keyboard accelerators are taken out before translation and put back after: a message with exactly one `_` or `&`
before a letter at the start of a word (`_File`, `Save &As`) is translated without it, and the marker goes before
the same letter in the translation (at the start of a word if it can), else before its first letter. A `&` that
starts an entity (`&amp;`) is not an accelerator. Placeholders are kept by the server's path
(`server/placeholders.py`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import polib

from server.documents.archive import Limits
from server.documents.document import Document
from server.documents.markup import from_markup, to_markup
from server.errors import InvalidDocument, InvalidEncoding

PLURAL_FORMS = {  # gettext's table (its manual, "Plural forms"), for the languages Tolk models are likely to serve
    "pt": "nplurals=2; plural=(n != 1);",
    "pt_BR": "nplurals=2; plural=(n > 1);",
    "en": "nplurals=2; plural=(n != 1);",
    "de": "nplurals=2; plural=(n != 1);",
    "es": "nplurals=2; plural=(n != 1);",
    "it": "nplurals=2; plural=(n != 1);",
    "nl": "nplurals=2; plural=(n != 1);",
    "fr": "nplurals=2; plural=(n > 1);",
    "ja": "nplurals=1; plural=0;",
    "ko": "nplurals=1; plural=0;",
    "zh": "nplurals=1; plural=0;",
    "ru": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "uk": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "pl": "nplurals=3; plural=(n==1 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
}
DEFAULT_PLURAL_FORMS = "nplurals=2; plural=(n != 1);"
_NPLURALS = re.compile(r"nplurals\s*=\s*(\d+)")
_ACCELERATOR = re.compile(r"(?<![\w&_])([_&])(?=[^\W_])(?!(?<=&)(?:[A-Za-z][A-Za-z0-9]*|#\d+|#[xX][0-9A-Fa-f]+);)")


def plural_forms(po: polib.POFile, target: str | None = None) -> str:
    """The Plural-Forms of the catalog's language (its header, else the language translated into, else its own
    Plural-Forms, else English-like)."""
    language = (po.metadata.get("Language", "").strip() or target or "").replace("-", "_")
    if language in PLURAL_FORMS:
        return PLURAL_FORMS[language]
    if language.split("_")[0] in PLURAL_FORMS:
        return PLURAL_FORMS[language.split("_")[0]]
    own = po.metadata.get("Plural-Forms", "")
    return own if _NPLURALS.search(own) else DEFAULT_PLURAL_FORMS


@dataclass(frozen=True)
class Accelerator:
    marker: str  # "_" or "&"
    letter: str


def strip_accelerator(text: str) -> tuple[str, Accelerator | None]:
    """text without its one keyboard accelerator marker, and the marker; texts with none or several are as they are."""
    found = list(_ACCELERATOR.finditer(text))
    if len(found) != 1:
        return text, None
    m = found[0]
    return text[: m.start()] + text[m.end():], Accelerator(m.group(1), text[m.end()])


def put_accelerator(text: str, accelerator: Accelerator | None) -> str:
    """The marker before the same letter (a word's first, if it can), else before the first letter."""
    if accelerator is None:
        return text
    letter = re.escape(accelerator.letter)
    m = (re.search(rf"(?<!\w){letter}", text) or re.search(rf"(?<!\w){letter}", text, re.IGNORECASE)
         or re.search(letter, text, re.IGNORECASE) or re.search(r"[^\W\d_]", text))
    at = m.start() if m else 0
    return text[:at] + accelerator.marker + text[at:]


def read_po(data: bytes, name: str, limits: Limits, target: str | None = None) -> Document:
    """A .po or .pot catalog: one text per untranslated msgid and msgid_plural."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidEncoding(f"{name} is not UTF-8 text (byte {exc.start}); convert it with msgconv") from exc
    if "\x00" in text:
        raise InvalidDocument(f"{name} is not a gettext catalog: it holds NUL characters")
    try:
        po = polib.pofile(text, wrapwidth=78)
    except (OSError, ValueError) as exc:
        raise InvalidDocument(f"{name} is not a valid gettext catalog ({exc})") from exc
    forms = plural_forms(po, target)
    nplurals = int(_NPLURALS.search(forms).group(1))  # type: ignore[union-attr]
    texts: list[str] = []
    fills: list[Callable[[list[str]], None]] = []
    for entry in po:
        if entry.obsolete or entry.translated() or entry.msgstr or any(entry.msgstr_plural.values()):
            continue
        fills.append(_plan_entry(entry, nplurals, texts))

    def rebuild(out: list[str]) -> bytes:
        translations = [from_markup(o, 1)[0] for o in out]
        for fill in fills:
            fill(translations)
        po.metadata["Content-Type"] = "text/plain; charset=UTF-8"
        po.metadata.setdefault("Content-Transfer-Encoding", "8bit")
        po.metadata["Plural-Forms"] = forms
        if target and not po.metadata.get("Language", "").strip():  # a template (.pot) becomes a catalog of target
            po.metadata["Language"] = target.replace("-", "_")
        po.encoding = "utf-8"
        return str(po).encode("utf-8") + b"\n"

    return Document(texts, rebuild)


def _plan_entry(entry: polib.POEntry, nplurals: int, texts: list[str]) -> Callable[[list[str]], None]:
    """Add the entry's texts; the function that fills its msgstr from the translations of every text."""
    singular, acc = strip_accelerator(entry.msgid)
    first = len(texts)
    texts.append(to_markup([singular]))
    if entry.msgid_plural:
        plural, plural_acc = strip_accelerator(entry.msgid_plural)
        texts.append(to_markup([plural]))

    def fill(translations: list[str]) -> None:
        if entry.msgid_plural:
            one = put_accelerator(translations[first], acc)
            many = put_accelerator(translations[first + 1], plural_acc)
            entry.msgstr_plural = {i: one if i == 0 and nplurals > 1 else many for i in range(nplurals)}
        else:
            entry.msgstr = put_accelerator(translations[first], acc)
        if "fuzzy" not in entry.flags:
            entry.flags.append("fuzzy")

    return fill
