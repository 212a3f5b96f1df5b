"""Inline HTML translated in context: a block's elements go back around the words aligned with theirs."""

from __future__ import annotations

import pytest

from model.events import Hypothesis
from server import inline
from server.plan import Plan, join, make_plan
from server.text import split_html
from tests.helpers import CHARS, identity, tags


def well_nested(document: str) -> bool:
    stack: list[str] = []
    for is_text, content in split_html(document):
        kind, name = inline._tag(content) if not is_text else ("text", "")
        if name not in inline.INLINE:
            continue
        if kind == "open":
            stack.append(name)
        elif kind == "close" and (not stack or stack.pop() != name):
            return False
    return not stack


PAGES = [
    "<p>Click <b>Retry</b> to try again.</p>",
    '<p>Read the <a href="/docs" title="x &amp; y">documentation</a>.</p>',
    '<ul>\n  <li><a href="x">Delete <em>all</em> files</a> in the folder.</li>\n</ul>',
    "<p><b>Save.</b> Then <i>quit</i>.</p>",
    "<p><b>First sentence. Second</b> sentence.</p>",
    "<p>Press <kbd>Ctrl</kbd>+<kbd>S</kbd>. <!-- note --> Click <img src=a.png> here.</p>",
    '<p>Run <code>make &lt;target&gt;</code> in <span translate="no">Tolk <b>Server</b></span>.</p>',
    '<div translate="no"><p>Keep <b>me</b>.</p></div><p>Not <b>me</b>.</p>',
    "<pre>one\n<b>two</b>\n</pre>",
    '<p>An <a name="top"></a>anchor and a <b>bold (word)</b>, then <i>"quoted"</i>!</p>',
]


@pytest.mark.parametrize("page", PAGES)
def test_a_page_translated_into_itself_comes_back(page: str) -> None:
    """Each character its own translation, aligned with itself: every tag goes back where it was."""
    plan = make_plan([page], CHARS, html=True, max_source_tokens=200)
    assert join(plan, 0, identity(plan), CHARS) == page


def test_sentences_see_no_inline_tags_and_keep_line_breaks_out() -> None:
    plan = make_plan(["<p>Save your <b>work</b>\n   often. <code>x</code> ok</p>"], CHARS, html=True,
                     max_source_tokens=200)
    sentences = [CHARS.decode(ids) for ids in plan.sources]
    assert sentences == ["Save your work    often.", "<x0/> ok"]
    assert set(plan.markup) == {0, 1}


def reversed_words(plan: Plan, sentence: int) -> Hypothesis:
    """The sentence's words in reverse order, each character aligned with its own source character."""
    source = CHARS.decode(plan.sources[sentence])
    starts = [i for i, c in enumerate(source) if not c.isspace() and (i == 0 or source[i - 1].isspace())]
    words = [(s, source[s:].split()[0]) for s in starts]
    tokens, alignment = [], []
    for n, (start, word) in enumerate(reversed(words)):
        if n:
            tokens.append(ord(" "))
            alignment.append(start - 1)
        tokens += [ord(c) for c in word]
        alignment += range(start, start + len(word))
    return Hypothesis(tokens, 0.0, "eos", alignment)


def test_elements_follow_their_words_when_the_translation_reorders_them() -> None:
    plan = make_plan(['<p>one <b>two</b> <i>three <a href="x">four</a></i> five</p>'], CHARS, html=True,
                     max_source_tokens=200)
    out = join(plan, 0, {0: reversed_words(plan, 0)}, CHARS)
    assert out == '<p>five <i><a href="x">four</a> three</i> <b>two</b> one</p>'


def test_without_alignment_every_element_is_kept_once_and_nested() -> None:
    page = '<p>one <b>two <i>three</i></b> <a href="x">four</a> five <u>six</u></p>'
    plan = make_plan([page], CHARS, html=True, max_source_tokens=200)
    for translation in ("uno dos tres cuatro cinco seis siete", "x", "a b"):
        out = join(plan, 0, {0: Hypothesis(CHARS.encode(translation), 0.0, "eos")}, CHARS)
        assert tags(out) == tags(page)
        assert well_nested(out), out


def test_two_elements_on_one_word_stay_apart() -> None:
    page = "<p><b>one</b> <i>two</i> three</p>"
    plan = make_plan([page], CHARS, html=True, max_source_tokens=200)
    both = [0] * 3 + [4] * 3  # "abc" and "def" both aligned with "one" and with "two" in turn
    for alignment in ([0, 0, 0, 0, 4, 4, 4], [4, 4, 4, 0, 0, 0, 0], [0, 4, 0, 0, 4, 0, 4], both + [0]):
        out = join(plan, 0, {0: Hypothesis(CHARS.encode("abc def"), 0.0, "eos", alignment)}, CHARS)
        assert tags(out) == tags(page) and well_nested(out), out


def test_an_element_inside_another_stays_inside_it() -> None:
    """The inner element's words aligned with nothing: placed by position, but never outside its parent."""
    page = "<p>one <b>two <i>three</i></b> four five six</p>"
    plan = make_plan([page], CHARS, html=True, max_source_tokens=200)
    translation = "A B C D E F"
    alignment = [0, 0, 4, 4, 14, 14, 14, 14, 14, 14, 14]  # A: one, B: two, the rest: four
    out = join(plan, 0, {0: Hypothesis(CHARS.encode(translation), 0.0, "eos", alignment)}, CHARS)
    assert out == "<p>A <b>B<i></i></b> C D E F</p>"


def test_an_element_inside_a_placeholder_goes_around_it() -> None:
    """The placeholder stays whole and comes back once: the element widens to its edges."""
    plan = make_plan(['<p>Match { $<b>index</b> } of { $<a href="#">total</a> }</p>'], CHARS, html=True,
                     max_source_tokens=200)
    out = join(plan, 0, identity(plan), CHARS)
    assert out == '<p>Match <b>{ $index }</b> of <a href="#">{ $total }</a></p>'


def test_a_stray_aligned_word_does_not_stretch_an_element() -> None:
    """Words aligned with the element far apart: it goes around the densest run of them, not all in between."""
    plan = make_plan(["<p>one <b>two three</b> four five</p>"], CHARS, html=True, max_source_tokens=200)
    translation = "A B C D E F"  # A: one, B C: two three, D E: four five, F: two again (the alignment's noise)
    alignment = [0, 0, 4, 0, 8, 0, 14, 0, 19, 0, 4]
    out = join(plan, 0, {0: Hypothesis(CHARS.encode(translation), 0.0, "eos", alignment)}, CHARS)
    assert out == "<p>A <b>B C</b> D E F</p>"
