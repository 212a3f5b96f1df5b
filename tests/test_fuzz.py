"""Fuzzing, bounded and seeded for CI: schemathesis against the server's own OpenAPI on a loopback server, and
hypothesis on the request models, the sentence planner, the ordered stream and the incremental detokenizer.

Each test's number of cases and seconds go to the `figures` of the run (printed at the end, and written to
$TOLK_TEST_FIGURES when set). Raise the budgets with TOLK_FUZZ_SCALE=10 for a longer local run.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, SecretStr, ValidationError
from schemathesis import Case

from model.checkpoint import LoadedModel
from model.events import Hypothesis
from model.tokenizer import REPLACEMENT, Tokenizer
from server.app import create_app
from server.errors import from_validation
from server.plan import join, make_plan
from server.schemas import GenerationOptions, SettingsUpdate, TranslateRequest
from server.settings import Settings
from server.stream import TextStream
from server.text import Sentence, fit, split_html, split_text
from tests.helpers import CHARS, identity, tags
from tests.live import live_server

pytestmark = pytest.mark.slow  # the full fuzz: schemathesis on a live server and hypothesis

SEED = 8  # one seed for every generator here: the same cases on every run
SCALE = int(os.environ.get("TOLK_FUZZ_SCALE", "1"))


def budget(examples: int) -> settings:
    """Hypothesis settings of a test: derandomized (same cases each run), no example database, no deadline."""
    return settings(max_examples=examples * SCALE, derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --- counting cases ------------------------------------------------------------------------------------------

CASES: Counter[str] = Counter()  # outcome -> cases, for the running test


def tried(outcome: str = "") -> None:
    """Count one case of the running test, and what came of it when that is worth telling."""
    CASES[outcome] += 1


@pytest.fixture(autouse=True)
def count_cases(request: pytest.FixtureRequest, figures: dict[str, object]) -> Iterator[None]:
    CASES.clear()
    start = time.perf_counter()
    yield
    if not CASES:
        return
    row: dict[str, object] = {"cases": CASES.total(), "seconds": round(time.perf_counter() - start, 2)}
    if set(CASES) - {""}:
        row["outcomes"] = {k: v for k, v in sorted(CASES.items()) if k}
    cast(dict[str, object], figures.setdefault("fuzz", {}))[request.node.name] = row


# --- schemathesis: the HTTP API against its own OpenAPI ---------------------------------------------------------

class ServerErrors(logging.Handler):
    """Error records of the server and of uvicorn: a crash after the answer started shows only here."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


LOGGERS = ("server", "uvicorn.error")
ADMIN_KEY = "fuzz-admin-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}  # POST /settings then gets past the key to the body
SERVER_ERRORS = ServerErrors()


@pytest.fixture(scope="module")
def base_url(tiny_model_dir: Path) -> Iterator[str]:
    """The tiny model on a loopback port, with small limits so refusals come often; its error log is watched."""
    config = Settings(_env_file=None, models=[tiny_model_dir], device="cpu",  # type: ignore[call-arg]
                      max_text_chars=400, max_texts=4, max_body_bytes=16 * 1024, request_timeout=15.0,
                      admin_key=SecretStr(ADMIN_KEY))
    for name in LOGGERS:
        logging.getLogger(name).addHandler(SERVER_ERRORS)
    try:
        with live_server(create_app(config)) as url:
            yield url
    finally:
        for name in LOGGERS:
            logging.getLogger(name).removeHandler(SERVER_ERRORS)


CONFIG = schemathesis.Config.from_dict({
    "seed": SEED,
    "generation": {"max-examples": 10 * SCALE, "deterministic": True, "database": "none"},
    "request-timeout": 20,  # a hang fails the case; the server's own timeout (15 s) answers 504 before
    "checks": {
        # "Schema-valid" is not "acceptable" here: the languages served, the limits of the running server and
        # whitespace-only text are checked by the server (400/413/422, all documented), not by JSON Schema.
        "positive_data_acceptance": {"enabled": False},
        # Lenient on purpose, as pydantic's lax mode is: "5" for 5 and 0/1 for false/true, which form and query
        # fields (always strings) need and LibreTranslate's clients may send in JSON too.
        "negative_data_rejection": {"enabled": False},
    },
})
# The server's own schema, known at collection: the app is only built (no model loads); the live server serves it.
OPENAPI = create_app(Settings(_env_file=None)).openapi()  # type: ignore[call-arg]
SCHEMA = schemathesis.openapi.from_dict(OPENAPI, config=CONFIG)
# Answers the schema does not declare yet; their routes (server/routes/settings.py, health.py) must declare them.
@SCHEMA.parametrize()
def test_openapi(case: Case, base_url: str) -> None:
    """Every operation: no 5xx, no hang, statuses, content types, headers and bodies as the schema says."""
    headers = ADMIN if case.operation.label == "POST /settings" else None
    response = case.call_and_validate(base_url=base_url, headers=headers)
    error = response.json().get("error_type", "") if response.status_code >= 400 else ""
    tried(f"{response.status_code} {error}".strip())


def test_the_live_server_serves_the_fuzzed_schema(base_url: str) -> None:
    assert httpx.get(f"{base_url}/openapi.json").json() == OPENAPI


def test_server_logged_no_errors(base_url: str, figures: dict[str, object]) -> None:
    """Nothing the fuzzer sent made the server log an error, not even after an answer had started (a stream the
    client left: schemathesis reads 20 events of a stream, then closes it)."""
    time.sleep(0.5)  # the last streams finish tearing down
    records = list(SERVER_ERRORS.records)
    figures["fuzz server errors"] = {"logged": len(records)}
    assert not records, "\n".join(f"{r.name}: {r.getMessage()} {r.exc_info and r.exc_info[1]!r}" for r in records)


# --- hypothesis: request models ----------------------------------------------------------------------------------

SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70) | st.floats()
           | st.text(max_size=12) | st.sampled_from(["", "auto", "en", "pt", "text", "html", "1", "true", "1e400"]))
JSONISH = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8),
                                                                                          inner, max_size=4),
                       max_leaves=10)
OPTIONS = st.dictionaries(st.sampled_from([*GenerationOptions.model_fields, "beam"]), JSONISH, max_size=5) | JSONISH
REQUEST = st.fixed_dictionaries({}, optional={
    "q": JSONISH | st.text() | st.lists(st.text(max_size=20), max_size=3), "source": JSONISH, "target": JSONISH,
    "format": JSONISH, "alternatives": JSONISH, "api_key": JSONISH, "options": OPTIONS, "colour": JSONISH,
})
UPDATE = st.fixed_dictionaries({}, optional={"model": JSONISH, "defaults": OPTIONS})
MODELS: list[type[BaseModel]] = [TranslateRequest, SettingsUpdate, GenerationOptions]


def validate_or_refuse(model: type[BaseModel], parse: Any) -> None:
    """Parse; a refusal must be a ValidationError that maps to a client error with a message."""
    try:
        value = parse()
    except ValidationError as exc:
        assert from_validation(exc).message
        return
    if isinstance(value, TranslateRequest):
        assert all(isinstance(t, str) for t in value.texts)
        value.options.generation()
    json.dumps(value.model_dump())


@budget(400)
@given(st.sampled_from(MODELS), REQUEST | UPDATE | OPTIONS | JSONISH, st.booleans())
def test_request_models_validate_or_refuse(model: type[BaseModel], payload: Any, as_text: bool) -> None:
    """Any JSON-ish payload, as objects or as JSON text (NaN included), validates or raises ValidationError."""
    tried()
    if as_text:
        text = json.dumps(payload)  # may hold NaN or Infinity, which JSON does not have
        validate_or_refuse(model, lambda: model.model_validate_json(text))
    else:
        validate_or_refuse(model, lambda: model.model_validate(payload))


@budget(200)
@given(st.sampled_from(MODELS), st.binary(max_size=64) | st.text(max_size=64))
def test_request_models_take_any_bytes(model: type[BaseModel], raw: bytes | str) -> None:
    tried()
    validate_or_refuse(model, lambda: model.model_validate_json(raw))


# --- hypothesis: sentence splitting and planning -----------------------------------------------------------------

# Any text without surrogates, and texts dense in what the splitter looks at: terminal punctuation, closing quotes,
# every kind of whitespace and line break, CJK full stops, upper and lower case.
SPLITTER_ALPHABET = list("aB .!?\n\r\t\u3002\uff01\u2026\"')]\u00bb\u201d\u00a0\u2028\u2029\x0b\x0c\x1c\x85\u3000e")
TEXT = (st.text(st.characters(exclude_categories=["Cs"]), max_size=200)
        | st.text(st.sampled_from(SPLITTER_ALPHABET), max_size=80))


def joined(parts: list[str | Sentence]) -> str:
    return "".join(p.text if isinstance(p, Sentence) else p for p in parts)


@budget(500)
@given(TEXT)
def test_split_text_keeps_every_character(text: str) -> None:
    tried()
    parts = split_text(text)
    assert joined(parts) == text
    for part in parts:
        if isinstance(part, Sentence):
            assert part.text and part.text == part.text.strip()
        else:
            assert part and not part.strip()


@budget(300)
@given(TEXT.map(str.strip).filter(bool), st.integers(1, 40))
def test_fit_pieces_fit_and_join_back(sentence: str, limit: int) -> None:
    tried()
    parts = fit(sentence, lambda s: len(s) > limit)
    assert joined(parts) == sentence
    assert all(0 < len(p.text) <= limit and p.text == p.text.strip() for p in parts if isinstance(p, Sentence))


@budget(300)
@given(st.lists(TEXT, min_size=1, max_size=3), st.integers(1, 60))
def test_plain_plan_joins_back_to_the_text(texts: list[str], max_source_tokens: int) -> None:
    """Sentences never empty, never longer than the model takes; joined back they are the text, whitespace and all."""
    tried()
    plan = make_plan(texts, CHARS, html=False, max_source_tokens=max_source_tokens)
    assert all(0 < len(ids) <= max_source_tokens for ids in plan.sources)
    translations = identity(plan)
    for t, text in enumerate(texts):
        assert join(plan, t, translations, CHARS) == text


def text_node(raw: str) -> str:
    return escape(raw, quote=False)


# HTML in the form the planner writes back: escaped text, lower-case end tags, markup of every kind.
HTML_PIECES = st.one_of(
    TEXT.map(text_node),
    st.sampled_from(["<p>", "</p>", '<a href="x?a=1&amp;b=2">', "</a>", "<br/>", "<B CLASS=x>", "</b>", "<img src=y>",
                     "<!-- note -->", "<!DOCTYPE html>", "<?xml version='1.0'?>", "<![CDATA[x < y]]>", "\n  ",
                     "<script>if (a < b) { x = '<p>' }</script>", "<style>p > a { color: red }</style>"]),
)
HTML = st.lists(HTML_PIECES, max_size=12).map("".join)


class TextContent(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def text_content(document: str) -> str:
    parser = TextContent()
    parser.feed(document)
    parser.close()
    return "".join(parser.text)


def words(document: str) -> list[str]:
    return text_content(document).split()


@budget(300)
@given(HTML, st.integers(1, 60))
def test_html_plan_keeps_every_tag_and_word(document: str, max_source_tokens: int) -> None:
    """Translated into itself, a page comes back with each tag exactly once and the same words (inline elements
    move to word boundaries, and line breaks inside a sentence become spaces)."""
    tried()
    plan = make_plan([document], CHARS, html=True, max_source_tokens=max_source_tokens)
    assert all(0 < len(ids) <= max_source_tokens for ids in plan.sources)
    out = join(plan, 0, identity(plan), CHARS)
    assert tags(out) == tags(document)
    assert "".join(words(out)) == "".join(words(document))


@budget(300)
@given(st.lists(HTML_PIECES.filter(lambda p: not p.startswith(("<b", "<B", "</b", "<a", "</a", "<img", "<!--"))),
                max_size=12).map("".join), st.integers(1, 60))
def test_html_plan_keeps_markup_verbatim(document: str, max_source_tokens: int) -> None:
    """Without inline markup a page is copied back exactly, whitespace and all."""
    tried()
    plan = make_plan([document], CHARS, html=True, max_source_tokens=max_source_tokens)
    assert join(plan, 0, identity(plan), CHARS) == document


@budget(200)
@given(st.lists(HTML_PIECES | st.sampled_from(["<", ">", "&", "</", "<p", "&amp", "&#39;", "</ p>"]), max_size=12)
       .map("".join))
def test_html_plan_keeps_the_text_of_any_markup(document: str) -> None:
    """Broken markup and raw '<' or '&' too: whatever the planner writes back reads as the same text."""
    tried()
    segments = split_html(document)
    # one text node is one segment, so a stray "<" in it does not cut a sentence in three
    assert not any(a[0] and b[0] for a, b in itertools.pairwise(segments)), segments
    plan = make_plan([document], CHARS, html=True, max_source_tokens=40)
    assert words(join(plan, 0, identity(plan), CHARS)) == words(document)


# --- hypothesis: the ordered stream of a text --------------------------------------------------------------------

@budget(300)
@given(TEXT | HTML, st.booleans(), st.data())
def test_stream_pieces_equal_the_joined_text(text: str, html: bool, data: st.DataObject) -> None:
    """Sentences decode in any interleaving, some replayed at the end (beam search): the pieces, concatenated, are
    the non-streamed text."""
    tried()
    plan = make_plan([text], CHARS, html=html, max_source_tokens=30)
    translations = {s: data.draw(st.text(max_size=6) | st.just(REPLACEMENT + "x")) for s in range(len(plan.sources))}
    best = {s: Hypothesis(CHARS.encode(t), 0.0, "eos") for s, t in translations.items()}
    stream = TextStream(plan, 0, CHARS)
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    pending = {s: CHARS.encode(t) for s, t in translations.items()}
    streamed = [p.text for p in stream.start()]
    while pending:
        s = rng.choice(sorted(pending))
        if pending[s] and rng.random() < 0.8:
            streamed += [p.text for p in stream.token(s, pending[s].pop(0), -1.0)]
        else:  # finished: what was not streamed is replayed from the hypothesis
            streamed += [p.text for p in stream.finish(s, best[s])]
            del pending[s]
    assert stream.done
    assert "".join(streamed) == stream.text == join(plan, 0, best, CHARS)


# --- hypothesis: the incremental detokenizer ---------------------------------------------------------------------

def marian_style(tokenizer: Tokenizer) -> Tokenizer:
    """The same SentencePiece behind a vocabulary list, as an imported Marian model has."""
    sp = tokenizer.target
    vocab = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    return Tokenizer(sp, sp, tokenizer.eos_id, tokenizer.unk_id, vocab=vocab)


@pytest.mark.parametrize("vocab", ["sentencepiece", "marian"])
def test_streamed_pieces_equal_the_full_decode(tiny_loaded: LoadedModel, vocab: str) -> None:
    """Random ids of the tiny vocabulary (specials, byte pieces that split characters, words): the pieces the
    detokenizer lets out, and its flush, concatenate to decode(all ids)."""
    tokenizer = tiny_loaded.tokenizer if vocab == "sentencepiece" else marian_style(tiny_loaded.tokenizer)
    sp = tokenizer.target
    size = sp.get_piece_size()
    high_bytes = [i for i in range(size) if sp.is_byte(i) and int(sp.id_to_piece(i)[1:-1], 16) >= 0x80]
    words = [i for i in range(size) if not sp.is_byte(i)]
    ids = st.lists(st.integers(0, size - 1), max_size=40) | st.lists(st.sampled_from(high_bytes + words), max_size=30)

    @budget(300)
    @given(ids)
    def check(ids: list[int]) -> None:
        tried()
        detok = tokenizer.detokenizer()
        pieces = [detok.push(i) for i in ids]
        assert "".join(pieces) + detok.flush() == tokenizer.decode(ids)

    check()


# --- hypothesis: generation options through the engine -----------------------------------------------------------

@pytest.fixture
def client(served: TestClient) -> TestClient:
    return served  # the session's shared app (conftest.py), its batcher in a child process: options cross over


INT_EDGES = [-1, 0, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1]  # int64's edges: a tensor holds what passes
FLOAT_EDGES: list[Any] = [-0.0, 5e-324, 1e308, "inf", "-inf", "nan", "1e400"]
FLOATS = ("length_penalty", "temperature", "top_p", "repetition_penalty")
OPTION_VALUES = {
    name: st.booleans() if name in ("do_sample", "return_scores")
    else (st.sampled_from(FLOAT_EDGES) | st.floats() | st.floats(0.05, 2.0)) if name in FLOATS
    else (st.sampled_from(INT_EDGES) | st.integers() | st.integers(0, 16))
    for name in GenerationOptions.model_fields
}
OPTION_SETS = st.lists(st.sampled_from(sorted(OPTION_VALUES)), max_size=3, unique=True).flatmap(
    lambda names: st.fixed_dictionaries({n: OPTION_VALUES[n] for n in names}))
EDGE_CASES = [{name: value, **({"do_sample": True} if name in ("temperature", "top_k", "top_p", "seed") else {})}
              for name in OPTION_VALUES if name not in ("do_sample", "return_scores")
              for value in (FLOAT_EDGES if name in FLOATS else INT_EDGES)]


def test_generation_options_never_fail_the_engine(client: TestClient) -> None:
    """Every option at its edges, then random option sets: refused (400/422) or translated, never a failed step."""

    def translate(options: dict[str, Any], alternatives: int = 0, stream: bool = False) -> None:
        body = {"q": "Open the file. Save all.", "target": "pt", "alternatives": alternatives, "options": options}
        r = client.post("/translate/stream" if stream else "/translate", content=json.dumps(body),
                        headers={"content-type": "application/json"})
        assert r.status_code in (200, 400, 422), (options, r.text)
        assert "event: error" not in r.text, (options, r.text)
        tried(str(r.status_code))

    for options in EDGE_CASES:
        translate(options)

    @budget(40)
    @given(OPTION_SETS, st.integers(0, 5), st.booleans())
    def random_sets(options: dict[str, Any], alternatives: int, stream: bool) -> None:
        translate(options, alternatives, stream)

    random_sets()
    assert CASES["200"] >= 10, CASES  # the engine did decode under the odd settings that pass
