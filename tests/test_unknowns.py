"""Generated unknown tokens written as the source piece they attend to most (`GenerationConfig.replace_unknowns`, as
argostranslate asks CTranslate2 to): the tokenizer's text, the plan's rendering, the stream's pieces and the engine's
alignment that feeds them."""

from __future__ import annotations

from pathlib import Path

import pytest
import sentencepiece as spm
from fastapi.testclient import TestClient

from model.checkpoint import LoadedModel
from model.events import Hypothesis, TokenEvent
from model.generation import GenerationConfig
from model.search import generate
from model.tokenizer import Tokenizer
from server.plan import join, make_plan
from server.stream import TextStream
from tests.helpers import parse_sse
from tests.tiny import corpus_lines

UNK = 3


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """A SentencePiece model without byte fallback, as Argos packages have: a character it never saw is <unk>."""
    directory = tmp_path_factory.mktemp("spm")
    text = directory / "train.txt"
    text.write_text("\n".join(corpus_lines()) + "\n")
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(directory / "m"), vocab_size=100,
                                   pad_id=0, bos_id=1, eos_id=2, unk_id=UNK, byte_fallback=False,
                                   character_coverage=1.0, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(directory / "m.model"))
    return Tokenizer(sp, sp, eos_id=2, unk_id=UNK)


def ids_of(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text)[:-1]  # without end-of-sentence


def test_source_strings_keep_unknown_characters(tokenizer: Tokenizer) -> None:
    text = "Open ☃ file."
    ids, strings = tokenizer.encode(text), tokenizer.source_strings(text)
    assert len(strings) == len(ids) and strings[-1] == ""  # end-of-sentence is no text
    unknown = [s for i, s in zip(ids, strings, strict=True) if i == UNK]
    assert unknown and "☃" in "".join(unknown)
    assert "".join(strings).replace("\u2581", " ").strip() == text


def test_an_unknown_token_is_written_as_its_source_piece(tokenizer: Tokenizer) -> None:
    out = ids_of(tokenizer, "Open the file.")
    with_unk = [*out[:1], UNK, *out[1:]]
    assert tokenizer.decode(with_unk) == "Open ⁇  the file."  # SentencePiece's own mark for an unknown
    assert tokenizer.decode(with_unk, {1: "\u2581☃"}) == "Open ☃ the file."
    assert tokenizer.decode([UNK, *out], {0: "\u2581☃"}) == "☃ Open the file."  # no leading space
    assert tokenizer.decode([*out[:-1], UNK, out[-1]], {len(out) - 1: "☃"}).endswith("file☃.")  # inside a word
    assert tokenizer.decode(out, {0: "\u2581☃"}) == tokenizer.decode(out)  # only an unknown token is replaced


@pytest.mark.parametrize("stream_tokens", [True, False], ids=["greedy", "beam"])
def test_streamed_text_equals_the_rendered_text(tokenizer: Tokenizer, stream_tokens: bool) -> None:
    """A stream writes each unknown token as it comes, from the event's source position; a beam search sentence
    replays its best hypothesis with its alignment; both end as the finished text does."""
    texts = ["Open Ж file. Save Ю now.", "Close Ж."]  # letters: a symbol (☃) would be carried as a placeholder
    plan = make_plan(texts, tokenizer, False, 64, unknowns=True)
    hyps = {}
    for s, source in enumerate(plan.sources):
        weird = [k for k, i in enumerate(source) if i == UNK]
        assert weird, "each sentence has an unknown character"
        tokens = [*source[:weird[0]], UNK, *source[weird[0] + 1:-1]]  # the sentence copied, its unknown kept
        hyps[s] = Hypothesis(tokens, 0.0, "eos", list(range(len(tokens))))
    rendered = [join(plan, t, hyps, tokenizer) for t in range(len(texts))]
    assert rendered == [t for t in texts]
    for t in range(len(texts)):
        stream = TextStream(plan, t, tokenizer)
        pieces = stream.start()
        for s in plan.texts[t].sentences:
            hyp = hyps[s]
            if stream_tokens:
                for token, source in zip(hyp.tokens, hyp.alignment or [], strict=True):
                    pieces += stream.token(s, token, -0.5, source)
            pieces += stream.finish(s, hyp)
        assert "".join(p.text for p in pieces) == rendered[t]


def test_without_the_setting_the_plan_keeps_no_pieces(tokenizer: Tokenizer) -> None:
    plan = make_plan(["Open Ж file."], tokenizer, False, 64)
    source = plan.sources[0]
    hyp = Hypothesis(source[:-1], 0.0, "eos", list(range(len(source) - 1)))
    assert plan.strings == {} and "Ж" not in join(plan, 0, {0: hyp}, tokenizer)


def test_the_engine_aligns_the_rows_that_replace_unknowns(tiny_loaded: LoadedModel, tiny_model_dir: Path) -> None:
    """replace_unknowns turns the row's alignment on, and each streamed token carries its source position."""
    from model.decode import DecodeBatch
    from model.search import step

    src = tiny_loaded.tokenizer.encode("Open the file and save it.")
    plain = generate(tiny_loaded.net, [src], GenerationConfig(max_new_tokens=12))[0][0]
    config = GenerationConfig(max_new_tokens=12, replace_unknowns=True)
    hyp = generate(tiny_loaded.net, [src], config)[0][0]
    assert hyp.tokens == plain.tokens and hyp.alignment is not None and len(hyp.alignment) == len(hyp.tokens)
    batch = DecodeBatch(tiny_loaded.net, 2, 64, 16)
    batch.admit([((0, 0), src, config)])
    sources: list[int | None] = []
    finished = None
    while finished is None:
        for event in step(batch):
            if isinstance(event, TokenEvent):
                sources.append(event.source)
            else:
                finished = event.hypotheses[0]
    assert sources == finished.alignment == hyp.alignment



@pytest.mark.parametrize("beam", [1, 2])
def test_the_option_through_the_server_streams_what_it_answers(served: TestClient, beam: int) -> None:
    """`options.replace_unknowns` through the child-process server (the session's shared app): the same text
    streamed and not, and the same as without it (the tiny model spells unknown characters in bytes, so it never
    emits an unknown token)."""
    body = {"q": "Open the file. Save it now.", "source": "en", "target": "pt", "options": {"beam_size": beam}}
    on = {**body, "options": {"beam_size": beam, "replace_unknowns": True}}
    plain = served.post("/translate", json=body).json()["translatedText"]
    answered = served.post("/translate", json=on)
    streamed = parse_sse(served.post("/translate/stream", json=on).text)
    assert plain and answered.status_code == 200 and answered.json()["translatedText"] == plain
    assert streamed[-1][1]["translatedText"] == plain
    pieces = "".join(data.get("token", {}).get("text", "") for event, data in streamed[:-1])
    assert pieces == plain
