"""A multilingual Marian model (opus-mt-en-ROMANCE and the like) picks its output language by a token at the start
of the source (>>por<<, >>spa<<): the server serves each token's language as a target, and a request's `target`
puts that token in front of every sentence, as MarianTokenizer does with ">>por<< text"."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import sentencepiece as spm
from fastapi.testclient import TestClient

from model import checkpoint
from model.search import generate
from server.app import create_app
from server.placeholders import clean
from tests.helpers import parse_sse, server_settings

TOKENS = {">>por<<": "pt", ">>spa<<": "es"}
TEXT = "Open the file before you save it."


@pytest.fixture(scope="module")
def multilingual_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a Marian vocabulary whose last two pieces are target-language tokens."""
    out = tmp_path_factory.mktemp("multilingual") / "tiny-en-mul"
    shutil.copytree(tiny_model_dir, out)
    sp = spm.SentencePieceProcessor(model_file=str(out / "source.spm"))
    vocab = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    vocab[-2:] = list(TOKENS)
    (out / "vocab.json").write_text(json.dumps(vocab))
    info = json.loads((out / "info.json").read_text())
    info.update(name="tiny-en-mul", target_language="mul")
    (out / "info.json").write_text(json.dumps(info))
    return out


@pytest.fixture(scope="module")
def client(multilingual_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(server_settings(multilingual_dir, scheduler_process=False))) as c:
        yield c


def offline(model_dir: Path, token: str, text: str) -> tuple[str, int]:
    """The engine alone on the source that starts with the language token, its text as the server answers a
    sentence without placeholders (the tiny model copies ">>spa<<" pieces, and "<<to tra>" reads as an invented
    usage token); and that source's length."""
    loaded = checkpoint.load(model_dir, device="cpu")
    assert loaded.tokenizer.piece_to_id is not None
    source = [loaded.tokenizer.piece_to_id[token], *loaded.tokenizer.encode(text)]
    (hyps,) = generate(loaded.net, [source], loaded.generation)
    return clean(loaded.tokenizer.decode(hyps[0].tokens), plain=True), len(source)


def test_the_token_languages_are_the_targets(client: TestClient) -> None:
    languages = client.get("/languages").json()
    assert [(entry["code"], entry["targets"]) for entry in languages] == [("en", ["es", "pt"])]
    (model,) = client.get("/models").json()
    assert (model["target"], model["targets"]) == ("mul", ["es", "pt"])


@pytest.mark.parametrize(("token", "target"), [(">>por<<", "pt-BR"), (">>spa<<", "es"), (">>por<<", "por")])
def test_the_target_puts_its_token_first(client: TestClient, multilingual_dir: Path, token: str,
                                         target: str) -> None:
    r = client.post("/translate", json={"q": TEXT, "source": "en", "target": target,
                                        "options": {"return_scores": True}})
    assert r.status_code == 200, r.text
    want, length = offline(multilingual_dir, token, TEXT)
    assert r.json()["translatedText"] == want
    assert r.json()["details"]["input_tokens"] == length  # the token went in with the sentence


def test_streamed_equals_not_streamed(client: TestClient) -> None:
    whole = client.post("/translate", json={"q": TEXT, "source": "en", "target": "es"}).json()["translatedText"]
    r = client.post("/translate/stream", json={"q": TEXT, "source": "en", "target": "es"})
    assert r.status_code == 200, r.text
    events = parse_sse(r.text)
    assert events[-1][0] == "done" and events[-1][1]["translatedText"] == whole


@pytest.mark.parametrize("target", ["fr", None])
def test_a_language_it_lacks_or_none_is_refused(client: TestClient, target: str | None) -> None:
    r = client.post("/translate", json={"q": TEXT, "source": "en", **({"target": target} if target else {})})
    assert r.status_code == 400, r.text
    assert r.json()["error_type"] == "unsupported_language"
