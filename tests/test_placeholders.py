"""Placeholders and control characters: found, masked, put back exactly once, through POST /translate.

The tiny model's translations are junk, so these check survival and placement invariants, not translation: every
placeholder of a source is in the output exactly as often as in the source, unchanged, and order-bound printf
conversions stay in their source order.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from server import masks
from server import placeholders as ph
from tests.helpers import kept, parse_sse

KINDS = {
    "printf": "Could not open %s: %d bytes, %.2f%% done, %zu left",
    "positional printf": "Move %1$s to %2$s",
    "python": "Hello %(name)s, you have %(count)d new messages",
    "qt": "Copying %1 of %2",
    "brace": "File {0} saved as {name} in {}",
    "fluent": "Allow { $origin } to use your camera?",
    "icu plural": "You have {count, plural, one {# file} other {# files}} open",
    "shell": "Set $HOME and ${XDG_DATA_HOME} first",
    "tag": "Click <b>Save</b> to keep<br/> the changes",
    "entity": "Tom &amp; Jerry &#169; &#x2014; here",
    "url": "See https://example.org/docs?a=1&b=2 for help.",
    "email": "Write to help@example.org today.",
    "path": "Copy /usr/share/tolk/model.bin to ~/models or C:\\Tolk\\models",
    "control": "Open\x02 the file\x1b now\x7f",
}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_is_found(kind: str) -> None:
    found = ph.find(KINDS[kind])
    assert found, kind
    expected = kind.split()[-1].replace("plural", "brace")
    assert expected in {p.kind for p in found} or kind == "positional printf" and found[0].kind == "printf"


def test_find_spans() -> None:
    assert [p.text for p in ph.find(KINDS["printf"])] == ["%s", "%d", "%.2f", "%%", "%zu"]
    assert [p.text for p in ph.find("See https://example.org/a. Or /etc/hosts, and/or 50% of it.")] == [
        "https://example.org/a", "/etc/hosts"]
    assert ph.find("and/or 1/2 km/h 50% off, R&D, a < b > c, $5") == []


ADVERSARIAL = [
    "%s%s%d",  # adjacent
    "%s and %s and %s",  # repeated
    "{{0}} {a{b{c}}d}",  # nested braces
    "{1} X1 %1$s {2}",  # the mask's own look, literally
    "{ 1 } and {1}",  # the lenient form of a mask
    "\x00",  # a character the unmasking uses itself is never masked (NUL is refused before)
    "%",
    "100%",
    "<<b>>",
    "",
]


@pytest.mark.parametrize("source", ADVERSARIAL + list(KINDS.values()))
@pytest.mark.parametrize("style", masks.STYLES, ids=[s.name for s in masks.STYLES])
def test_round_trip(source: str, style: masks.MaskStyle) -> None:
    masked = masks.mask(source, style)
    if style is masks.LETTER:  # "X2" glued to a word ("SaveX2") is not found again: repaired, not round-tripped
        assert kept(source, masks.unmask(masked, masked.text))
    else:
        assert masks.unmask(masked, masked.text) == source
    assert all(shown in masked.text for shown in masked.masks)
    numbered = [n for n in masked.numbers if n]
    assert len(set(numbered)) == len(numbered)


@pytest.mark.parametrize("source", ADVERSARIAL + list(KINDS.values()))
@pytest.mark.parametrize("translation", ["", "um dois três", "{1} {1} {1}", "{99} X", "{ 2 }{2}", "%1$s"])
@pytest.mark.parametrize("repair", ["aligned", "end"])
def test_unmask_keeps_each_placeholder_once(source: str, translation: str, repair: str) -> None:
    out = masks.unmask(masks.mask(source), translation, repair)
    assert kept(source, out), (source, translation, out)


def test_dropped_placeholder_goes_back_near_its_place() -> None:
    masked = masks.mask("Could not open %s because of an error")
    out = masks.unmask(masked, "Não foi possível abrir porque ocorreu um erro")  # by relative position: a word off
    assert out == "Não foi possível %s abrir porque ocorreu um erro"
    assert masks.unmask(masked, "Não foi possível abrir porque ocorreu um erro", "end").endswith("erro %s")
    assert masks.unmask(masks.mask("%s copied"), "copiado") == "%s copiado"
    assert masks.unmask(masks.mask("Copied: %s"), "Copiado:") == "Copiado: %s"


def test_damaged_copy_is_mended_not_doubled() -> None:
    assert masks.unmask(masks.mask("Hello %(name)s, bye"), "Olá %(name), tchau") == "Olá %(name)s, tchau"
    assert masks.unmask(masks.mask("Saved.<x2/>Close it."), "Salvo.<x2/Feche.") == "Salvo.<x2/>Feche."
    assert masks.unmask(masks.mask("Open %s now"), "Abrir % agora").count("%s") == 1  # too short to tell: inserted


def test_order_bound_conversions_keep_source_order() -> None:
    source = "%s of %d and %1$s of %2$s"
    masked = masks.mask(source, masks.BRACES)
    assert masked.text == "{1} of {2} and {3} of {4}"
    assert masks.unmask(masked, "{4} de {3}, {2} de {1}") == "%2$s de %1$s, %s de %d"
    assert masks.unmask(masks.mask(source), "%2$s de %1$s, %d de %s") == "%2$s de %1$s, %s de %d"


def exact(source: str, out: str) -> bool:
    """The output's placeholders are the source's, as a multiset (none lost, none repeated, none invented)."""
    return Counter(p.text for p in ph.find(out)) == Counter(p.text for p in ph.find(source))


INVENTED = [  # (source, what the model wrote, what the user gets)
    ("copied message id = { $id } to { $folder }", "id de mensagem copiado = { $id } para { $pasta } { $folder }",
     "id de mensagem copiado = { $id } para { $folder }"),
    ("Delete all messages and subfolders in the { $folder } folder?",
     "Excluir todas as mensagens e subpastas na { $folder } pasta { $pasta }?",
     "Excluir todas as mensagens e subpastas na { $folder } pasta?"),
    ("Delete %d files from {folder}?", "Excluir %d arquivos de {folder} {pasta}?", "Excluir %d arquivos de {folder}?"),
    ("Delete %d files from {folder}?", "Excluir %d arquivos de {pasta}?", "Excluir %d arquivos de {folder}?"),
    ("Hello %(name)s", "Olá %(nome)s", "Olá %(name)s"),
    ("Open the file", "Abrir o {arquivo} %s", "Abrir o"),
    ("Tom & Jerry", "Tom &amp; Jerry", "Tom & Jerry"),
    ("Save the file", "<b>Salvar</b> o arquivo", "Salvar o arquivo"),
    ("Click <b0></b0> to save", "Clique <b0> para</b0> salvar", "Clique <b0></b0> para salvar"),  # Immersive's marks
]


@pytest.mark.parametrize(("source", "wrote", "gets"), INVENTED)
def test_a_placeholder_the_source_lacks_is_never_answered(source: str, wrote: str, gets: str) -> None:
    masked = masks.mask(source)
    assert masked.text == source  # the kinds the model copies are shown as they are
    assert masks.unmask(masked, wrote) == gets
    assert exact(source, gets)


def test_usage_tokens_are_kept_and_never_duplicated() -> None:
    source = "{ $commandName } <nick> <message>: Send a private message [<channel>] to <new mode>"
    masked = masks.mask(source)
    assert [p.kind for p in masked.placeholders] == ["fluent", "usage", "usage", "usage", "usage"]
    wrote = "{ $commandName } <usuário> <nick> <mensagem>: <message> Envia uma mensagem privada [<canal>] a <new mode>"
    assert masks.unmask(masked, wrote) == (
        "{ $commandName } <nick>: <message> Envia uma mensagem privada [<channel>] a <new mode>")
    translated = masks.unmask(masked, "{ $commandName } <apelido> <mensagem>: Envia [<canal>] a <novo modo>")
    assert translated == "{ $commandName } <nick> <message>: Envia [<channel>] a <new mode>"
    assert [p.kind for p in ph.find("Press <b>Save</b> or <br> and <kbd>Ctrl</kbd>, <p>Done")] == ["tag"] * 6


KIND_SAMPLES = ["%s", "%1$d", "%(count)d", "%2", "{0}", "{name}", "{}", "{ $user }", "{n, plural, one {# file} other "
                "{# files}}", "$HOME", "${XDG_DIR}", "<b>", "</b>", "<br/>", "<nick>", "&amp;", "https://example.org/a",
                "help@example.org", "/usr/share/tolk", "\x02", "\u200d", "\u2060", "\u200b", "\ufeff", "\u2028",
                "\u2029", "\u202e", "\u202c", "\u2066", "🎉", "👨\u200d👩\u200d👧", "👍🏽", "🇧🇷", "✅"]
INVENTIONS = ["{pasta}", "{ $pasta }", "%(nome)s", "<usuário>", "$PASTA", "%d", "{7}", "{ 1 }", "&xxe;", "%1",
              "http://exemplo.com", "<i>", "😀", "\u200f", "%%", "{}", "/tmp/x"]
WORDS = ["o", "arquivo", "salvar", "de", "em", "pasta", ".", "?", ":", "%", "{", "}", "<", "&", "/"]


@st.composite
def model_outputs(draw: st.DrawFn) -> tuple[str, str]:
    """A source with placeholders of every kind in several positions, and what a model might write for its masked
    text: the masks and placeholders kept, dropped, repeated, moved, damaged or translated, and new ones."""
    kinds = draw(st.lists(st.sampled_from(KIND_SAMPLES), min_size=1, max_size=5))
    words = draw(st.lists(st.sampled_from(["Open", "the", "file", "in", "folder", "now", "Save", "as"]),
                          min_size=len(kinds) + 1, max_size=len(kinds) + 1))
    source = " ".join(w for pair in zip(words, [*kinds, ""], strict=True) for w in pair if w).strip()
    masked = masks.mask(source)
    pool = [*masked.masks, *INVENTIONS, *WORDS, *(m[:-1] for m in masked.masks if len(m) > 2)]
    out = draw(st.lists(st.sampled_from(pool), max_size=12))
    return source, draw(st.sampled_from([" ", ""])).join(out)


@settings(max_examples=1500, derandomize=True, database=None, deadline=None)
@given(model_outputs())
def test_whatever_the_model_writes_the_placeholders_are_the_sources(case: tuple[str, str]) -> None:
    source, wrote = case
    for repair in ("aligned", "end"):
        out = masks.unmask(masks.mask(source), wrote, repair)
        assert exact(source, out), (source, wrote, out)


@settings(max_examples=500, derandomize=True, database=None, deadline=None)
@given(st.lists(st.sampled_from([*INVENTIONS, *WORDS, "arquivo", "100%", "R$ 5"]), max_size=10))
def test_a_plain_sentence_keeps_only_what_streams(words: list[str]) -> None:
    """A sentence without placeholders loses what a model invents that begins with a sign, and nothing before its
    first sign and the spaces in front of it changes (the stream sends that part as it decodes)."""
    wrote = " ".join(words)
    out = ph.clean(wrote, plain=True)
    assert not [p for p in ph.find(out) if p.kind not in ("url", "email", "path")], (wrote, out)
    first = len(wrote[:next((k for k, c in enumerate(wrote) if ph.holds(c)), len(wrote))].rstrip())
    assert out[:first] == wrote[:first]


@pytest.fixture
def client(served: TestClient) -> TestClient:
    return served  # the session's shared app (conftest.py): these tests only read


def translate(client: TestClient, q: str | list[str], fmt: str = "text") -> object:
    r = client.post("/translate", json={"q": q, "source": "en", "target": "pt", "format": fmt})
    assert r.status_code == 200, r.text
    return r.json()["translatedText"]


def test_every_kind_survives_translate(client: TestClient) -> None:
    sources = list(KINDS.values())
    outputs = translate(client, sources[:8]), translate(client, sources[8:])
    assert isinstance(outputs[0], list) and isinstance(outputs[1], list)
    for source, out in zip(sources, outputs[0] + outputs[1], strict=True):
        assert kept(source, out), (source, out)
        ordered = [p.text for p in ph.find(source) if p.ordered]
        assert [m.group() for m in re.finditer("|".join(map(re.escape, set(ordered))), out)] == ordered if ordered \
            else True


def test_long_sentence_split_keeps_placeholders(client: TestClient) -> None:
    source = " ".join(f"the file {{ $name{i} }} could not be opened %{i}$s" for i in range(1, 30))
    out = translate(client, source)
    assert isinstance(out, str) and kept(source, out)
    assert out.count("$name") == 29  # a piece of a placeholder cut in two would leave a stray "$nameN }"


def test_control_characters_kept_nul_refused(client: TestClient) -> None:
    source = "menu\x04Open\x02 the file\x1b[31m now\x85"
    out = translate(client, source)
    assert isinstance(out, str)
    assert Counter(c for c in out if ord(c) < 32 or 0x7f <= ord(c) < 0xa0) == Counter("\x04\x02\x1b\x85")
    r = client.post("/translate", json={"q": "a\x00b", "source": "en", "target": "pt"})
    assert (r.status_code, r.json()["error_type"]) == (400, "invalid_text")


def test_html_text_nodes_keep_placeholders(client: TestClient) -> None:
    out = translate(client, "<p>Open %s in {0} &lt;b&gt;</p>", "html")
    assert isinstance(out, str)
    assert out.startswith("<p>") and out.endswith("</p>")
    assert out.count("%s") == 1 and out.count("{0}") == 1 and out.count("&lt;b&gt;") == 1


def test_streamed_equals_non_streamed_with_placeholders(client: TestClient) -> None:
    q = ["Open %s now. Save the file.", "Allow { $origin } to open\x02 the file."]
    whole = translate(client, q)
    r = client.post("/translate/stream", json={"q": q, "source": "en", "target": "pt"})
    done = {d["index"]: d["translatedText"] for e, d in parse_sse(r.text) if e == "done"}
    pieces: dict[int, str] = {}
    for e, d in parse_sse(r.text):
        if e == "token":
            pieces[d["index"]] = pieces.get(d["index"], "") + d["token"]["text"]
    assert [done[0], done[1]] == whole == [pieces[0], pieces[1]]
    assert all("{1}" not in p for p in pieces.values())


CHARACTERS = ["🎉 Congratulations!", "Open 😀 file", "Saved ✅", "Family: 👨\u200d👩\u200d👧 and 👍🏽 in 🇧🇷",
              "Keycap 1\ufe0f\u20e3 here", "Price: 5 € at 20 °C ©", "a\u200db\u2060c\u200bd", "\ufeffStart of file",
              "Line one\u2028line two\u2029end", "\u202eReversed\u202c and \u2066isolated\u2069 text",
              "Left\u200emark\u200f and soft\u00adhyphen"]


def carried(text: str) -> list[str]:
    """The characters a translation must carry, in order: emoji, symbols and Unicode format characters."""
    return [c for c in text if ph.holds(c) or unicodedata.category(c) in ("So", "Sc", "Sk", "Zl", "Zp")]


@pytest.mark.parametrize("texts", [CHARACTERS[:6], CHARACTERS[6:]])
def test_emoji_symbols_and_format_characters_come_back_in_order(client: TestClient, texts: list[str]) -> None:
    out = translate(client, texts)
    assert isinstance(out, list)
    for source, text in zip(texts, out, strict=True):
        assert carried(text) == carried(source), (source, text)
    r = client.post("/translate/stream", json={"q": texts, "source": "en", "target": "pt"})
    pieces: dict[int, str] = {}
    for e, d in parse_sse(r.text):
        if e == "token":
            pieces[d["index"]] = pieces.get(d["index"], "") + d["token"]["text"]
        elif e == "done":
            assert d["translatedText"] == out[d["index"]] == pieces.get(d["index"], "")


def test_a_stream_ends_as_the_answer_when_the_model_invents_a_placeholder(tiny_model_dir: Path) -> None:
    """A plain sentence streams until a sign that may begin a placeholder; the rest waits for the end, when what the
    model invented is taken out, so that the pieces still make the answer."""
    from model import checkpoint
    from model.events import Hypothesis
    from server.plan import join, make_plan
    from server.stream import TextStream

    tokenizer = checkpoint.read_meta(tiny_model_dir).tokenizer
    plan = make_plan(["Open the file now."], tokenizer, False, 64)
    wrote = tokenizer.encode("Abrir o {arquivo} agora %s e <b>fim</b> &amp; mais")[:-1]
    best = Hypothesis(wrote, 0.0, "eos", None)
    answer = join(plan, 0, {0: best}, tokenizer)
    assert answer == "Abrir o agora e fim & mais"
    stream = TextStream(plan, 0, tokenizer)
    pieces = stream.start()
    for token in wrote:
        pieces += stream.token(0, token, -0.1)
    sent = "".join(p.text for p in pieces)
    assert sent == "Abrir o"  # held from the first sign, and the space before it
    pieces += stream.finish(0, best)
    assert "".join(p.text for p in pieces) == answer


def test_an_entity_html_does_not_define_comes_back_as_written(client: TestClient) -> None:
    """`&xxe;` (from an internal DTD the server refuses, or a typo) stays as written; no entity is invented."""
    out = translate(client, "<p>Open &xxe; the file &amp; save it.</p>", "html")
    assert isinstance(out, str) and out.startswith("<p>") and out.endswith("</p>")
    assert out.count("&xxe;") == 1 and "&amp;xxe;" not in out
    assert re.findall(r"&\w+;", out).count("&xxe;") == 1 and set(re.findall(r"&\w+;", out)) <= {"&xxe;", "&amp;"}
