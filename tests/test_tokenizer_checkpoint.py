"""Tokenizer round-trips, streaming detokenization, and the model directory format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from model import checkpoint
from model.search import greedy
from model.tokenizer import REPLACEMENT

TEXTS = ["Open the file.", "Salvar configurações não é possível: ação.", "Disk full — 100% (ünïcödé ✓ 翻訳)", "a  b"]


def test_tokenizer_round_trips(tiny_loaded: checkpoint.LoadedModel) -> None:
    tok = tiny_loaded.tokenizer
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids[-1] == tok.eos_id
        assert tok.decode(ids) == " ".join(text.split())  # SentencePiece normalises runs of spaces


def test_source_bos_and_eos_follow_the_model_config(tiny_model_dir: Path, tmp_path: Path) -> None:
    """add_source_eos false (OpenNMT-py / Argos models) drops the end-of-sentence, add_source_bos puts bos first;
    a directory without the fields keeps today's source (eos last)."""
    plain = checkpoint.read_meta(tiny_model_dir).tokenizer
    text = "Open the file."
    for bos, eos in ((False, False), (True, True), (True, False)):
        directory = tmp_path / f"{bos}-{eos}"
        directory.mkdir()
        for f in tiny_model_dir.iterdir():
            if f.is_file():
                (directory / f.name).write_bytes(f.read_bytes())
        cfg = json.loads((tiny_model_dir / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**cfg, "add_source_bos": bos, "add_source_eos": eos}))
        meta = checkpoint.read_meta(directory)
        body = plain.encode(text)[:-1]
        assert meta.tokenizer.encode(text) == [meta.cfg.bos_id] * bos + body + [meta.cfg.eos_id] * eos
        empty = [meta.cfg.bos_id] * bos + [meta.cfg.eos_id] * (eos or not bos)
        assert meta.tokenizer.encode("") == empty  # never an empty source
    old = {k: v for k, v in json.loads((tiny_model_dir / "config.json").read_text()).items()
           if k not in ("add_source_bos", "add_source_eos")}  # a directory written before the flags existed
    (tmp_path / "False-False" / "config.json").write_text(json.dumps(old))
    assert checkpoint.read_meta(tmp_path / "False-False").tokenizer.encode(text) == plain.encode(text)


def test_incremental_detokenizer_never_emits_broken_characters(tiny_loaded: checkpoint.LoadedModel) -> None:
    tok = tiny_loaded.tokenizer
    for text in TEXTS:
        ids = tok.encode(text)[:-1]
        detok = tok.detokenizer()
        pieces = [detok.push(i) for i in ids] + [detok.flush()]
        assert all(REPLACEMENT not in p for p in pieces)
        assert "".join(pieces) == tok.decode(ids)


def test_byte_fallback_pieces_wait_for_the_whole_character(tiny_loaded: checkpoint.LoadedModel) -> None:
    tok = tiny_loaded.tokenizer
    ids = tok.encode("翻")[:-1]
    byte_ids = [i for i in ids if tok.target.is_byte(i)]
    assert len(byte_ids) == 3, "a CJK character falls back to three UTF-8 bytes in the tiny vocabulary"
    detok = tok.detokenizer()
    pieces = [detok.push(i) for i in ids]
    assert pieces[-1].endswith("翻") and all("翻" not in p for p in pieces[:-1])


def test_save_load_round_trip(tiny_loaded: checkpoint.LoadedModel, tmp_path: Path) -> None:
    src = tiny_loaded.path
    out = tmp_path / "copy"
    checkpoint.save(out, tiny_loaded.model, tiny_loaded.info, src / "source.spm", src / "target.spm",
                    generation={"beam_size": 2, "max_new_tokens": 30})
    again = checkpoint.load(out, device="cpu")
    assert again.model.cfg == tiny_loaded.model.cfg
    assert again.info == tiny_loaded.info
    assert again.generation.beam_size == 2 and again.generation.max_new_tokens == 30
    for (name, a), (_, b) in zip(tiny_loaded.model.state_dict().items(), again.model.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name
    assert again.model.out_proj.weight is again.model.tgt_embed.weight  # tying survives the file format
    sources = [tiny_loaded.tokenizer.encode(t) for t in TEXTS]
    assert greedy(again.net, sources, 16) == greedy(tiny_loaded.net, sources, 16)


def test_meta_reads_everything_but_the_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    for f in tiny_model_dir.iterdir():
        if f.is_file():
            (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "model.safetensors").write_bytes(b"not weights")  # read_meta must not open them; load must
    meta = checkpoint.read_meta(tmp_path)
    loaded = checkpoint.load(tiny_model_dir, device="cpu")
    assert (meta.cfg, meta.info, meta.generation) == (loaded.model.cfg, loaded.info, loaded.generation)
    assert meta.tokenizer.encode(TEXTS[1]) == loaded.tokenizer.encode(TEXTS[1])
    with pytest.raises(Exception):  # noqa: B017 (safetensors' own error type)
        checkpoint.load(tmp_path, device="cpu")
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        checkpoint.read_meta(tmp_path)


def test_load_in_other_dtype(tiny_model_dir: Path) -> None:
    loaded = checkpoint.load(tiny_model_dir, device="cpu", dtype="bfloat16")
    assert loaded.model.out_proj.weight.dtype == torch.bfloat16
    assert greedy(loaded.net, [loaded.tokenizer.encode("Open the file.")], 8)


def test_load_refuses_bad_directories_and_options(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        (tmp_path / "config.json").write_text((tiny_model_dir / "config.json").read_text())
        checkpoint.load(tmp_path)
    with pytest.raises(ValueError, match="dtype"):
        checkpoint.load(tiny_model_dir, dtype="float8")
    bad = json.loads((tiny_model_dir / "config.json").read_text()) | {"d_model": 30}
    with pytest.raises(ValueError, match="d_model"):
        checkpoint.ModelConfig.from_dict(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            checkpoint.resolve_device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_matches_cpu(tiny_model_dir: Path, tiny_loaded: checkpoint.LoadedModel) -> None:
    gpu = checkpoint.load(tiny_model_dir, device="cuda")
    sources = [tiny_loaded.tokenizer.encode(t) for t in TEXTS]
    assert greedy(gpu.net, sources, 16) == greedy(tiny_loaded.net, sources, 16)


def test_int8_logits_track_float32(tiny_model_dir: Path, tiny_loaded: checkpoint.LoadedModel) -> None:
    quantized = checkpoint.load(tiny_model_dir, device="cpu", dtype="int8", int8="dynamic")  # the modules quantized
    src = torch.tensor([tiny_loaded.tokenizer.encode(TEXTS[1])])
    tgt = torch.tensor([[1] + tiny_loaded.tokenizer.encode(TEXTS[1])[:-1]])
    with torch.no_grad():
        exact, approx = tiny_loaded.model(src, tgt), quantized.model(src, tgt)
    assert isinstance(quantized.model.out_proj, torch.ao.nn.quantized.dynamic.Linear)
    assert (exact.argmax(-1) == approx.argmax(-1)).float().mean() >= 0.9
    assert torch.corrcoef(torch.stack([exact.flatten(), approx.flatten()]))[0, 1] > 0.99
