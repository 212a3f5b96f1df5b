"""Training recipe: the run's direction (en->pt or pt->en) and float16 storage of exported weights."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from model import checkpoint, evaluate, train
from model.search import greedy
from model.transformer import Transformer
from tests.tiny import corpus_lines

TEXTS = ["Open the file.", "Save changes before closing the window.", "Disk full."]
WORDS_PT = {"the": "o", "file": "arquivo", "could": "pôde", "not": "não", "be": "ser", "opened": "aberto",
            "save": "salvar", "changes": "alterações", "open": "abrir", "settings": "configurações",
            "window": "janela", "error": "erro", "disk": "disco", "full": "cheio", "copy": "copiar"}


def write_corpus(directory: Path, n: int = 300) -> Path:
    """A synthetic parallel corpus: train/dev/test .en and .pt, the Portuguese side word by word."""
    directory.mkdir(parents=True, exist_ok=True)
    en = corpus_lines(n, seed=3)
    pt = [" ".join(WORDS_PT.get(w.lower(), w) for w in line.split()) for line in en]
    cut = {"train": (0, n - 40), "dev": (n - 40, n - 20), "test": (n - 20, n)}
    for split, (a, b) in cut.items():
        (directory / f"{split}.en").write_text("\n".join(en[a:b]) + "\n", encoding="utf-8")
        (directory / f"{split}.pt").write_text("\n".join(pt[a:b]) + "\n", encoding="utf-8")
    return directory


def train_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_pt_en_run_trains_exports_and_evaluates_in_its_direction(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    corpus, run = write_corpus(tmp_path / "corpus"), tmp_path / "run"
    common = ("--corpus", str(corpus), "--run", str(run), "--spm", str(tiny_model_dir / "source.spm"))
    assert train.main(train_args(*common, "--source", "pt", "--target", "en", "--arch", "tiny", "--device", "cpu",
                                 "--threads", "1", "--max-tokens", "256", "--max-steps", "4", "--save-every", "2",
                                 "--eval-every", "1000")) == 0
    assert sorted(p.name for p in run.glob("train.*.npz")) == ["train.en.npz", "train.pt.npz"]
    with pytest.raises(ValueError, match="pt->en"):  # resuming never turns a run round
        train.main(train_args(*common, "--source", "en"))
    assert train.main(train_args(*common, "--export", str(tmp_path / "model"), "--average", "2")) == 0
    info = checkpoint.ModelInfo.load(tmp_path / "model" / "info.json")
    assert info == checkpoint.ModelInfo("pt-en", "pt", "en")
    parser = argparse.ArgumentParser()
    evaluate.add_arguments(parser)
    caplog.set_level(logging.INFO, logger="model.evaluate")
    out = tmp_path / "scores.json"
    evaluate.main(parser.parse_args(["--model", str(tmp_path / "model"), "--corpus", str(corpus), "--device", "cpu",
                                     "--threads", "1", "--json", str(out)]))
    assert f"{corpus / 'test.pt'} -> {corpus / 'test.en'}" in caplog.text
    assert json.loads(out.read_text())["sentences"] == 20


def test_runs_keep_their_languages(tiny_model_dir: Path, tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text("{}")
    assert train.run_languages(old, None, None) == ("en", "pt")  # runs from before --source were en->pt
    with pytest.raises(ValueError, match="en->pt"):
        train.run_languages(old, "pt", "en")
    new = tmp_path / "new"
    new.mkdir()
    assert train.run_languages(new, "pt", "en") == ("pt", "en")
    assert train.run_languages(new, None, None) == ("pt", "en")  # stored in languages.json
    with pytest.raises(ValueError, match="both"):
        train.run_languages(tmp_path, "pt", "pt")


def rounded_to_float16(model: Transformer) -> Transformer:
    copy = Transformer(model.cfg)
    copy.load_state_dict({k: v.half().float() for k, v in model.state_dict().items()})
    return copy.eval()


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_float16_storage_loads_as_the_float32_model_rounded(tiny_model_dir: Path, tmp_path: Path, dtype: str) -> None:
    """Stored in float16 == rounded to float16 in memory and stored in float32: the storage changes nothing else."""
    original = checkpoint.load(tiny_model_dir, device="cpu")
    spm = tiny_model_dir / "source.spm"
    checkpoint.save(tmp_path / "half", original.model, original.info, spm, spm, weights_dtype="float16")
    checkpoint.save(tmp_path / "rounded", rounded_to_float16(original.model), original.info, spm, spm)
    size = (tmp_path / "half" / "model.safetensors").stat().st_size
    assert size < 0.55 * (tiny_model_dir / "model.safetensors").stat().st_size
    with safe_open(str(tmp_path / "half" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}  # noqa: SIM118 (not a dict)
    half = checkpoint.load(tmp_path / "half", device="cpu", dtype=dtype)
    rounded = checkpoint.load(tmp_path / "rounded", device="cpu", dtype=dtype)
    if dtype == "float32":
        assert all(p.dtype == torch.float32 for p in half.model.parameters())
        for (k, a), b in zip(half.model.state_dict().items(), rounded.model.state_dict().values(), strict=True):
            assert torch.equal(a, b), k
    src = torch.tensor([original.tokenizer.encode(TEXTS[1])])
    tgt = torch.tensor([[1] + original.tokenizer.encode(TEXTS[1])[:-1]])
    with torch.no_grad():
        assert torch.equal(half.model(src, tgt), rounded.model(src, tgt))
    sources = [original.tokenizer.encode(t) for t in TEXTS]
    assert greedy(half.net, sources, 16) == greedy(rounded.net, sources, 16)
    assert greedy(half.net, sources, 16) == greedy(original.net, sources, 16)  # a trained model shrugs it off


def test_save_refuses_other_storage_dtypes(tiny_loaded: checkpoint.LoadedModel, tiny_model_dir: Path,
                                           tmp_path: Path) -> None:
    spm = tiny_model_dir / "source.spm"
    with pytest.raises(ValueError, match="weights_dtype"):
        checkpoint.save(tmp_path, tiny_loaded.model, tiny_loaded.info, spm, spm, weights_dtype="int8")


def test_a_run_starts_from_an_exported_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    """--init: a new run begins with the given model's weights (its first snapshot equals them after 0 steps of
    change), and a model of another architecture is refused by name."""
    corpus = write_corpus(tmp_path / "corpus")
    common = ("--corpus", str(corpus), "--spm", str(tiny_model_dir / "source.spm"), "--arch", "tiny", "--device",
              "cpu", "--threads", "1", "--max-tokens", "256", "--eval-every", "1000")
    first = tmp_path / "first"
    assert train.main(train_args(*common, "--run", str(first), "--max-steps", "3", "--save-every", "3", "--lr", "0.05",
                                 "--warmup", "1")) == 0  # weights far from the seed's: the check below can tell
    assert train.main(train_args(*common, "--run", str(first), "--export", str(tmp_path / "model"),
                                 "--average", "1")) == 0
    second = tmp_path / "second"
    assert train.main(train_args(*common, "--run", str(second), "--init", str(tmp_path / "model"), "--lr", "0",
                                 "--max-steps", "1", "--save-every", "1")) == 0
    exported = checkpoint.load(tmp_path / "model", device="cpu", keep_modules=True).model
    state = torch.load(second / "state.pt", weights_only=True)["model"]
    for name, value in exported.state_dict().items():  # lr 0: one step changes nothing
        torch.testing.assert_close(state[name], value, msg=name)
    with pytest.raises(ValueError, match="architecture differs"):
        train.main(train_args(*common, "--run", str(tmp_path / "third"), "--arch", "small", "--init",
                              str(tmp_path / "model"), "--max-steps", "1"))
