"""Sentence splitting, text checks and HTML segmentation of the server (no model needed)."""

from __future__ import annotations

import pytest

from server.errors import EmptyText, InvalidText, PayloadTooLarge
from server.text import Sentence, check_text, fit, split_html, split_text


def joined(parts: list[str | Sentence]) -> str:
    return "".join(p.text if isinstance(p, Sentence) else p for p in parts)


@pytest.mark.parametrize("text", [
    "One sentence",
    "  Leading and trailing.  \n",
    "First one. Second one! Third?\n\n\tIndented line.\r\nWindows line.",
    "He said \"stop.\" Then left. e.g. this stays whole.",
    "中文句子。第二句。",
    "a\n\n\n",
])
def test_split_text_keeps_every_character(text: str) -> None:
    parts = split_text(text)
    assert joined(parts) == text
    for part in parts:
        if isinstance(part, Sentence):
            assert part.text == part.text.strip() and part.text
        else:
            assert not part.strip()  # literals are whitespace only


def test_split_text_sentences() -> None:
    parts = split_text("Open the file. Save it!\n\nClose it? e.g. now. 3 done.")
    assert [p.text for p in parts if isinstance(p, Sentence)] == [
        "Open the file.", "Save it!", "Close it? e.g. now.", "3 done."]


def test_fit_splits_at_whitespace_until_each_piece_fits() -> None:
    sentence = "word " * 40 + "end"
    parts = fit(sentence, lambda s: len(s) > 30)
    assert joined(parts) == sentence
    assert all(len(p.text) <= 30 for p in parts if isinstance(p, Sentence))
    unbroken = "x" * 100
    assert joined(fit(unbroken, lambda s: len(s) > 30)) == unbroken


@pytest.mark.parametrize(("text", "error"), [
    ("", EmptyText), ("  \n\t", EmptyText), ("x" * 11, PayloadTooLarge),
    ("nul\x00", InvalidText), ("surrogate\ud800", InvalidText),
])
def test_check_text_refuses(text: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        check_text(text, 0, max_chars=10)


def test_check_text_accepts_tabs_newlines_and_other_controls() -> None:
    check_text("a\tb\r\nc", 0, max_chars=10)
    check_text("bell\x07\x02\x85\x1b", 0, max_chars=10)  # carried as placeholders (server/placeholders.py)


def test_split_html_keeps_markup_verbatim() -> None:
    doc = '<p class="x">Hello &amp; bye.</p><br/><!-- note --><script>var a = "<b>";</script>'
    parts = split_html(doc)
    assert [t for is_text, t in parts if is_text] == ["Hello & bye."]
    assert "".join(t for is_text, t in parts if not is_text).startswith('<p class="x"></p><br/>')
    assert ('var a = "<b>";' in [t for is_text, t in parts if not is_text])


@pytest.mark.parametrize("doc", [
    "<svg><linearGradient id=a></linearGradient></svg> Hello.",  # SVG and XHTML names are case-sensitive
    "<P>Hello.</P >",
    "<b>Bold</B> and <script>var a = '</B>';</SCRIPT> done.",
])
def test_split_html_keeps_end_tags_verbatim(doc: str) -> None:
    assert "".join(t for _, t in split_html(doc)) == doc
