"""Training recipe: the run's direction (en->pt or pt->en) and float16 storage of exported weights."""

from __future__ import annotations

import argparse
import json
import logging
import platform
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from model import checkpoint, evaluate, train
from model.buckets import make_batches
from model.search import greedy
from model.transformer import Transformer
from tests.helpers import write_corpus

pytestmark = pytest.mark.slow  # training runs

TEXTS = ["Open the file.", "Save changes before closing the window.", "Disk full."]


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


def test_bfloat16_autocast_gives_the_float32_loss_and_gradient(tiny_model_dir: Path, tmp_path: Path) -> None:
    """--autocast bfloat16 runs the forward pass in bfloat16 (its loss is not float32's bit for bit) and trains the
    same model: the loss within bfloat16's rounding of float32's, the gradient pointing the same way."""
    import sentencepiece as spm

    corpus, spm_path = write_corpus(tmp_path / "corpus"), tiny_model_dir / "source.spm"
    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    results = {}
    for choice in ("off", "bfloat16"):
        args = train_args("--corpus", str(corpus), "--run", str(tmp_path / choice), "--arch", "tiny", "--device",
                          "cpu", "--autocast", choice, "--dropout", "0")
        args.run.mkdir()
        torch.manual_seed(0)
        vocab = train.Vocabularies(spm_path, spm_path)
        trainer = train.Trainer(args, train.build_config(args, sp.get_piece_size()), vocab, ("en", "pt"))
        ids = make_batches(trainer.src, trainer.tgt, 512, 128, 0)[0]
        loss, _ = trainer.loss(ids)
        loss.backward()
        grad = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
        results[choice] = (float(loss.detach()), grad)
    (loss32, grad32), (loss16, grad16) = results["off"], results["bfloat16"]
    assert loss16 != loss32
    assert loss16 == pytest.approx(loss32, rel=2e-2)
    assert float(F.cosine_similarity(grad16, grad32, dim=0)) > 0.99


def test_autocast_auto_is_off_where_bfloat16_would_be_emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, name, lambda: False, raising=False)
    assert train.autocast_dtype("auto", cpu) is None
    assert train.autocast_dtype("bfloat16", cpu) is torch.bfloat16  # asked for: done, if slowly
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert train.autocast_dtype("auto", cpu) is torch.bfloat16
    assert train.autocast_dtype("off", cpu) is None


def test_the_step_loss_is_the_whole_batch_loss_and_gradient(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Trainer.loss projects only the real target positions and, on the CPU, runs attention on the math path:
    in float32 its loss and gradient are those of the plain formulation (all logits, padding ignored by
    cross_entropy, PyTorch's default attention kernels) on a batch that has padding in both sides."""
    import sentencepiece as spm

    corpus, spm_path = write_corpus(tmp_path / "corpus"), tiny_model_dir / "source.spm"
    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    args = train_args("--corpus", str(corpus), "--run", str(tmp_path / "run"), "--arch", "tiny", "--device", "cpu",
                      "--autocast", "off", "--dropout", "0")
    args.run.mkdir()
    torch.manual_seed(0)
    vocab = train.Vocabularies(spm_path, spm_path)
    trainer = train.Trainer(args, train.build_config(args, sp.get_piece_size()), vocab, ("en", "pt"))
    ids = max(make_batches(trainer.src, trainer.tgt, 512, 128, 0), key=len)
    src, tgt_in, labels = train.collate(ids, trainer.src, trainer.tgt, 0, trainer.cfg.decoder_start_id)
    assert (src == 0).any() and (labels == 0).any()  # padding in both, or the check below shows nothing

    def grads() -> torch.Tensor:
        out = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
        trainer.model.zero_grad(set_to_none=True)
        return out

    loss, n = trainer.loss(ids)
    loss.backward()
    step_grad = grads()
    logits = trainer.model(src, tgt_in)
    plain = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=0, label_smoothing=args.label_smoothing)
    plain.backward()
    torch.testing.assert_close(loss, plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(step_grad, grads(), rtol=1e-4, atol=1e-6)
    assert n == int((src != 0).sum() + (labels != 0).sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_dropout_keeps_the_rate_and_the_mean_and_follows_torchs_seed(dtype: torch.dtype) -> None:
    """layers.Dropout draws its CPU masks with NumPy: each element kept with probability 1 - p and scaled so the
    mean is unchanged, the gradient masked and scaled alike, the mask decided by torch.manual_seed, and nothing
    dropped in evaluation."""
    from model.layers import Dropout

    drop = Dropout(0.1).train()
    x = torch.full((1000, 1000), 2.0, dtype=dtype, requires_grad=True)
    torch.manual_seed(5)
    y = drop(x)
    kept = y.detach() != 0
    assert float(kept.float().mean()) == pytest.approx(0.9, abs=2e-3)
    assert float(y.detach().float().mean()) == pytest.approx(2.0, rel=5e-3)
    y.backward(torch.ones_like(y))
    assert x.grad is not None
    torch.testing.assert_close(x.grad, (y / 2).detach())  # the same mask, the same scale
    torch.manual_seed(5)
    assert torch.equal(drop(x), y)
    torch.manual_seed(6)
    assert not torch.equal(drop(x), y)
    assert drop.eval()(x) is x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_row_by_row_loss_is_pytorchs_label_smoothed_cross_entropy(dtype: torch.dtype) -> None:
    """train.smoothed_cross_entropy against F.cross_entropy on the float32 logits: the same loss and gradient, over
    a row count that is not a multiple of the rows taken at a time, with and without smoothing."""
    torch.manual_seed(0)
    n, v = train.CE_ROWS * 3 + 5, 97
    labels = torch.randint(0, v, (n,))
    for eps in (0.0, 0.1):
        logits = (torch.randn(n, v) * 4).to(dtype).requires_grad_()
        ours = train.smoothed_cross_entropy(logits, labels, eps)
        (ours * n).backward()  # the row sum's gradient: each row's own, of order 1
        assert logits.grad is not None
        our_grad, logits.grad = logits.grad.clone(), None
        theirs = F.cross_entropy(logits.float(), labels, label_smoothing=eps)
        (theirs * n).backward()
        assert ours.dtype == torch.float32 and our_grad.dtype == dtype
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(our_grad, logits.grad)


def test_a_cpu_run_gives_freed_memory_back_every_few_steps(tiny_model_dir: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(train, "TRIM_EVERY", 2)
    monkeypatch.setattr(train, "release_freed_memory", lambda device: calls.append(device.type))
    corpus, run = write_corpus(tmp_path / "corpus"), tmp_path / "run"
    spm_path = str(tiny_model_dir / "source.spm")
    args = train_args("--corpus", str(corpus), "--run", str(run), "--spm", spm_path, "--arch", "tiny",
                      "--device", "cpu", "--threads", "1", "--max-tokens", "256", "--max-steps", "5",
                      "--save-every", "100", "--eval-every", "1000")
    assert train.main(args) == 0
    assert calls == ["cpu", "cpu"]  # after steps 2 and 4
    if platform.libc_ver()[0] == "glibc":  # where there is glibc, its malloc_trim is found and runs
        assert train._malloc_trim() is not None
        train.release_freed_memory(torch.device("cpu"))
