"""Text handling around the model: checks, sentence splitting that keeps every whitespace, HTML segments.

A text becomes a list of parts: literal strings (whitespace, HTML tags) that are copied to the output as they
are, and sentences that are translated. Joining the parts back, with each sentence replaced by its translation,
keeps the newlines, indentation and markup of the original.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser

from server.errors import EmptyText, InvalidText, PayloadTooLarge

# NUL and lone surrogates (from JSON escapes) are refused; other control characters (gettext's \x02 marker, an
# escape sequence) are carried through translation like placeholders (`server/placeholders.py`).
_REFUSED = re.compile(r"[\x00\ud800-\udfff]")
_LINE_BREAK = re.compile(r"(\s*[\r\n]\s*)")
# A sentence ends with terminal punctuation and optional closing quotes or brackets, then whitespace
# (or no whitespace after the CJK full stops).
_CLOSING = "\"'\u201d\u2019\u00bb\u300d)\\]"
_SENTENCE_END = re.compile(rf"[.!?\u2026]+[{_CLOSING}]*\s+|[\u3002\uff01\uff1f]+[{_CLOSING}]*\s*")


@dataclass
class Sentence:
    text: str  # no leading or trailing whitespace


Part = str | Sentence


def check_texts(texts: list[str], max_texts: int, max_chars: int, verb: str = "translate") -> None:
    """Refuse a request without texts or with too many, and each text that check_text refuses."""
    if not texts:
        raise EmptyText(f"q is empty; there is nothing to {verb}")
    if len(texts) > max_texts:
        raise PayloadTooLarge(f"{len(texts)} texts in one request; the limit is {max_texts}")
    for i, text in enumerate(texts):
        check_text(text, i, max_chars, verb)


def check_text(text: str, index: int, max_chars: int, verb: str = "translate") -> None:
    """Refuse empty, whitespace-only, too long texts and texts with NUL or lone surrogates."""
    where = f"q[{index}]"
    if not text.strip():
        raise EmptyText(f"{where} is empty; there is nothing to {verb}")
    if len(text) > max_chars:
        raise PayloadTooLarge(f"{where} has {len(text)} characters; the limit is {max_chars}")
    bad = _REFUSED.search(text)
    if bad:
        what = "the character" if bad.group() > "\x00" else "the control character"
        raise InvalidText(f"{where} contains {what} U+{ord(bad.group()):04X} at {bad.start()}")


def split_sentences(line: str) -> list[Part]:
    """Sentences of one line (no line breaks inside), with the whitespace between them as literals.

    A boundary followed by a lower-case letter is taken for an abbreviation ("e.g. this") and not split.
    """
    parts: list[Part] = []
    start = 0
    for m in _SENTENCE_END.finditer(line):
        end = m.end()
        if end >= len(line) or line[end].islower():
            continue
        stop = m.start() + len(m.group().rstrip())
        parts.extend([Sentence(line[start:stop]), line[stop:end]] if stop < end else [Sentence(line[start:stop])])
        start = end
    parts.append(Sentence(line[start:]))
    return parts


def split_text(text: str) -> list[Part]:
    """Whitespace and line breaks as literals, sentences in between; joining the parts gives back the text."""
    core = text.strip()
    if not core:
        return [text] if text else []
    head, tail = text[: len(text) - len(text.lstrip())], text[len(text.rstrip()):]
    parts: list[Part] = [head] if head else []
    for i, chunk in enumerate(_LINE_BREAK.split(core)):
        if i % 2:
            parts.append(chunk)
        else:
            parts.extend(split_sentences(chunk))
    if tail:
        parts.append(tail)
    return parts


def fit(sentence: str, too_long: Callable[[str], bool]) -> list[Part]:
    """Split a sentence the model cannot take in one piece at the whitespace nearest its middle, recursively."""
    if not too_long(sentence) or len(sentence) < 2:
        return [Sentence(sentence)]
    middle = len(sentence) // 2
    gaps = [m for m in re.finditer(r"\s+", sentence)]
    if gaps:
        gap = min(gaps, key=lambda m: abs(m.start() - middle))
        left, space, right = sentence[: gap.start()], gap.group(), sentence[gap.end():]
    else:
        left, space, right = sentence[:middle], "", sentence[middle:]
    return [*fit(left, too_long), *([space] if space else []), *fit(right, too_long)]


class _Segmenter(HTMLParser):
    """Splits HTML into markup (kept verbatim) and text nodes (translated); script and style stay markup.

    Character references are unescaped into the text; a named one that HTML does not define (`&xxe;`) is kept as
    markup, as it was written, so that it comes back as it went rather than escaped (`&amp;xxe;`)."""

    RAW = {"script", "style"}

    def __init__(self, document: str) -> None:
        super().__init__(convert_charrefs=False)
        self.parts: list[tuple[bool, str]] = []  # (is_text, content); text is unescaped
        self._raw_depth = 0
        self._end_start = -1
        self._document = document
        self._lines = [0, *(m.end() for m in re.finditer("\n", document))]  # where each line starts

    def _reference(self, name: str) -> str:
        """The reference being handled as written: "&" name, and its ";" if it has one."""
        line, column = self.getpos()
        end = self._lines[line - 1] + column + len(name) + 1
        return self._document[end - len(name) - 1:end] + (";" if self._document[end:end + 1] == ";" else "")

    def handle_entityref(self, name: str) -> None:
        raw = self._reference(name)
        value = html.unescape(raw)
        if value == raw and raw.endswith(";"):
            self.parts.append((False, raw))
        else:
            self._text(value)

    def handle_charref(self, name: str) -> None:
        self._text(html.unescape(self._reference("#" + name)))

    def _markup(self) -> None:
        self.parts.append((False, self.get_starttag_text() or ""))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._markup()
        self._raw_depth += tag in self.RAW

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._markup()

    def parse_endtag(self, i: int) -> int:
        self._end_start = i  # where the end tag starts: handle_endtag gets its name lower-cased, not its text
        return super().parse_endtag(i)

    def handle_endtag(self, tag: str) -> None:
        start = self._end_start
        end = self.rawdata.find(">", start) + 1 if start >= 0 else 0
        raw = self.rawdata[start:end] if end else ""
        # Verbatim ("</linearGradient>" stays so); an end tag the parser made up itself is rebuilt from its name.
        self.parts.append((False, raw if raw[2:].lower().startswith(tag) else f"</{tag}>"))
        self._end_start = -1
        self._raw_depth -= tag in self.RAW and self._raw_depth > 0

    def handle_data(self, data: str) -> None:
        if self._raw_depth:  # script and style, as written
            self.parts.append((False, data))
        else:  # (a reference the document ends in, "&amp", is not one the parser reports)
            self._text(html.unescape(data))

    def _text(self, text: str) -> None:
        if self.parts and self.parts[-1][0]:  # a stray "<" comes as data of its own: one text node
            self.parts[-1] = (True, self.parts[-1][1] + text)
        else:
            self.parts.append((True, text))

    def handle_comment(self, data: str) -> None:
        self.parts.append((False, f"<!--{data}-->"))

    def handle_decl(self, decl: str) -> None:
        self.parts.append((False, f"<!{decl}>"))

    def handle_pi(self, data: str) -> None:
        self.parts.append((False, f"<?{data}>"))

    def unknown_decl(self, data: str) -> None:  # <![CDATA[...]]> and other marked sections
        self.parts.append((False, f"<![{data}]]>"))


def split_html(document: str) -> list[tuple[bool, str]]:
    """HTML as (is_text, content) segments; text segments are unescaped, markup is verbatim."""
    parser = _Segmenter(document)
    parser.feed(document)
    parser.close()
    return parser.parts
