"""OPUS-MT / Marian import and export, checked against transformers.

The reference is a tiny MarianMTModel built here: SentencePiece models trained on a few hundred generated lines,
a Marian-style joint vocab.json, random initialisation and a few seconds of training (so that translations end
at varied lengths and beam search has real choices), saved in the Hugging Face layout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from model import argos, checkpoint, marian, marian_export, marian_format
from model.layers import sinusoidal_table
from model.marian_format import UnsupportedCheckpoint
from model.search import generate
from tests.helpers import build_hf_dir, load_hf, sample_texts, server_settings, source_lines, target_lines
from tests.tiny import corpus_lines, tiny_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never wait for a hub
transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[dev]')")

pytestmark = pytest.mark.slow  # parity with transformers, on Marian models trained here

LOGITS_ATOL = 1e-4  # float32; on the CPU both sides run the same kernels and the measured difference is 0.0


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_hf_dir(tmp_path_factory.mktemp("hf") / "opus-mt-en-pt")


@pytest.fixture(scope="module")
def hf(hf_dir: Path) -> tuple[Any, Any]:
    return load_hf(hf_dir)


@pytest.fixture(scope="module")
def imported(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> checkpoint.LoadedModel:
    out = marian.import_marian(hf_dir, tmp_path_factory.mktemp("tolk") / "en-pt")
    return checkpoint.load(out, device="cpu")


def hf_generate(model: Any, tokenizer: Any, texts: list[str], **settings: Any) -> list[list[int]]:
    """transformers' generate(), as token ids without the decoder start, end-of-sentence and padding."""
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, **settings).tolist()
    special = {model.config.eos_token_id, model.config.pad_token_id, model.config.decoder_start_token_id}
    return [[t for t in row[1:] if t not in special] for row in out]


def tolk_generate(loaded: checkpoint.LoadedModel, texts: list[str], **settings: Any) -> list[list[int]]:
    sources = [loaded.tokenizer.encode(t) for t in texts]
    return [h[0].tokens for h in generate(loaded.net, sources, loaded.generation.update(**settings))]


def test_tokenization_equals_marian_tokenizer(hf: tuple[Any, Any], imported: checkpoint.LoadedModel) -> None:
    _, tokenizer = hf
    for text in sample_texts():
        assert imported.tokenizer.encode(text) == tokenizer(text).input_ids, text


def test_imported_config_maps_marian_fields(imported: checkpoint.LoadedModel, hf: tuple[Any, Any]) -> None:
    cfg, hf_cfg = imported.model.cfg, hf[0].config
    pad = hf_cfg.pad_token_id
    assert (cfg.pad_id, cfg.eos_id, cfg.decoder_start_id, cfg.bos_id) == (pad, 0, pad, -1)
    assert (cfg.activation, cfg.norm, cfg.scale_embedding, cfg.share_embeddings) == ("swish", "post", True, True)
    assert imported.generation.beam_size == 4
    assert imported.generation.max_new_tokens == 22  # max_length 24 less the start token and the forced eos
    assert imported.tokenizer.vocab is not None and imported.tokenizer.vocab[cfg.pad_id] == "<pad>"


def teacher_forced(hf: tuple[Any, Any], loaded: checkpoint.LoadedModel, texts: list[str]) -> tuple[torch.Tensor, ...]:
    """Logits of transformers and of Tolk for the same padded batch, and the mask of real target positions."""
    model, tokenizer = hf
    batch = tokenizer(texts, text_target=target_lines(len(texts), 3), return_tensors="pt", padding=True)
    pad, start = loaded.model.cfg.pad_id, loaded.model.cfg.decoder_start_id
    labels = batch.pop("labels")
    tgt_in = torch.cat([torch.full_like(labels[:, :1], start), labels[:, :-1]], dim=1)
    with torch.no_grad():
        theirs = model(**batch, decoder_input_ids=tgt_in).logits
        ours = loaded.model(batch["input_ids"], tgt_in)
    return theirs, ours, labels != pad


def test_logits_equal_transformers(hf: tuple[Any, Any], imported: checkpoint.LoadedModel) -> None:
    theirs, ours, real = teacher_forced(hf, imported, sample_texts())
    assert (theirs - ours)[real].abs().max() < LOGITS_ATOL


def test_greedy_equals_transformers_generate(hf: tuple[Any, Any], imported: checkpoint.LoadedModel) -> None:
    texts = sample_texts()
    theirs = hf_generate(*hf, texts, num_beams=1)
    assert len({len(t) for t in theirs}) > 3  # outputs end at varied lengths, some at the limit
    assert tolk_generate(imported, texts, beam_size=1) == theirs


@pytest.mark.parametrize(("max_length", "length_penalty"), [(24, 1.0), (12, 1.0), (24, 0.6), (24, 2.0)])
def test_beam_search_equals_transformers_generate(
    hf: tuple[Any, Any], imported: checkpoint.LoadedModel, max_length: int, length_penalty: float
) -> None:
    texts = sample_texts()
    theirs = hf_generate(*hf, texts, num_beams=4, max_length=max_length, length_penalty=length_penalty)
    ours = tolk_generate(imported, texts, beam_size=4, max_new_tokens=max_length - 2, length_penalty=length_penalty)
    assert ours == theirs


def test_decoded_text_equals_marian_tokenizer(hf: tuple[Any, Any], imported: checkpoint.LoadedModel) -> None:
    _, tokenizer = hf
    for ids in tolk_generate(imported, sample_texts(), beam_size=1):
        theirs = tokenizer.decode(ids, skip_special_tokens=True, use_source_tokenizer=False,
                                  clean_up_tokenization_spaces=False)
        assert imported.tokenizer.decode(ids).strip() == theirs  # transformers strips the ends


@pytest.mark.parametrize("changes", [
    dict(activation_function="gelu", share_encoder_decoder_embeddings=False, tie_word_embeddings=False,
         scale_embedding=False),
    dict(activation_function="relu", tie_word_embeddings=False),
])
def test_other_marian_configurations_give_equal_logits(tmp_path: Path, changes: dict[str, Any]) -> None:
    src = build_hf_dir(tmp_path / "hf", seed=1, steps=0, **changes)
    hf = load_hf(src)
    loaded = checkpoint.load(marian.import_marian(src, tmp_path / "tolk"), device="cpu")
    assert not loaded.model.cfg.tie_output  # and transformers 5 then shares nothing: three separate tables
    theirs, ours, real = teacher_forced(hf, loaded, sample_texts(12))
    assert (theirs - ours)[real].abs().max() < LOGITS_ATOL


def test_pytorch_model_bin_is_loaded_without_pickle(hf_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "bin"
    shutil.copytree(hf_dir, src)
    weights = marian.load_weights(src)
    shared = weights["model.shared.weight"]  # transformers 4 also wrote the tied tables and the positions
    for name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"):
        weights[name] = shared.clone()
    for stack in ("encoder", "decoder"):
        weights[f"model.{stack}.embed_positions.weight"] = sinusoidal_table(128, 32)
    (src / "model.safetensors").unlink()
    torch.save(weights, src / "pytorch_model.bin")
    a = checkpoint.load(marian.import_marian(hf_dir, tmp_path / "a"), device="cpu").model.state_dict()
    b = checkpoint.load(marian.import_marian(src, tmp_path / "b"), device="cpu").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def same_model_dirs(a: Path, b: Path) -> None:
    for name in ("config.json", "generation.json", "vocab.json", "info.json", "source.spm", "target.spm"):
        assert (a / name).exists() == (b / name).exists(), name
        if (a / name).exists():
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_export_then_import_is_the_identity(imported: checkpoint.LoadedModel, hf: tuple[Any, Any],
                                            tmp_path: Path) -> None:
    out = marian_export.export_marian(imported.path, tmp_path / "hf")
    same_model_dirs(imported.path, marian.import_marian(out, tmp_path / "again", name=imported.info.name))
    theirs, _, real = teacher_forced(hf, imported, sample_texts(12))
    again, _, _ = teacher_forced(load_hf(out), imported, sample_texts(12))
    assert torch.equal(theirs[real], again[real])


def test_a_tolk_model_exports_to_transformers(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = marian_export.export_marian(tiny_model_dir, tmp_path / "hf")
    hf = load_hf(out)
    loaded = checkpoint.load(tiny_model_dir, device="cpu")
    hf_id = json.loads((out / "vocab.json").read_text())  # pad moved last: the other ids shift down by one
    assert hf_id["<pad>"] == loaded.model.cfg.src_vocab_size - 1 and hf[0].config.decoder_start_token_id == 0

    def as_hf(ids: list[int]) -> list[int]:
        return [hf_id[loaded.tokenizer.source.id_to_piece(i)] for i in ids]

    texts = corpus_lines(24, seed=5)
    for text in texts:
        assert hf[1](text).input_ids == as_hf(loaded.tokenizer.encode(text))
    for beam in (1, 4):
        ours = [as_hf(t) for t in tolk_generate(loaded, texts, beam_size=beam)]
        assert ours == hf_generate(*hf, texts, num_beams=beam)
    same_model_dirs(tiny_model_dir, marian.import_marian(out, tmp_path / "again", name=loaded.info.name))


def edited_copy(src: Path, dst: Path, file: str, changes: dict[str, Any]) -> Path:
    shutil.copytree(src, dst)
    data = json.loads((dst / file).read_text())
    (dst / file).write_text(json.dumps({**data, **changes}))
    return dst


@pytest.mark.parametrize(("file", "changes", "field"), [
    ("config.json", {"activation_function": "gelu_new"}, "activation_function"),
    ("config.json", {"normalize_embedding": True}, "normalize_embedding"),
    ("config.json", {"static_position_embeddings": False}, "static_position_embeddings"),
    ("config.json", {"normalize_before": True}, "normalize_before"),
    ("config.json", {"decoder_attention_heads": 2}, "decoder_attention_heads"),
    ("config.json", {"model_type": "bart"}, "model_type"),
    ("generation_config.json", {"early_stopping": True}, "early_stopping"),
    ("generation_config.json", {"bad_words_ids": [[5]]}, "bad_words_ids"),
    ("generation_config.json", {"forced_eos_token_id": 3}, "forced_eos_token_id"),
    ("generation_config.json", {"num_beam_groups": 2}, "num_beam_groups"),
    ("tokenizer_config.json", {"separate_vocabs": True}, "separate_vocabs"),
])
def test_unsupported_fields_are_refused_by_name(
    hf_dir: Path, tmp_path: Path, file: str, changes: dict[str, Any], field: str
) -> None:
    src = edited_copy(hf_dir, tmp_path / "hf", file, changes)
    shutil.copyfile(src / "vocab.json", src / "target_vocab.json")
    with pytest.raises(UnsupportedCheckpoint, match=field):
        marian.import_marian(src, tmp_path / "out")


def test_unknown_tensors_and_pre_norm_export_are_refused(hf_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "hf"
    shutil.copytree(hf_dir, src)
    weights = marian.load_weights(src)
    weights["model.encoder.layernorm_embedding.weight"] = torch.ones(32)
    save_file(weights, str(src / "model.safetensors"))
    with pytest.raises(UnsupportedCheckpoint, match="layernorm_embedding"):
        marian.import_marian(src, tmp_path / "out")
    with pytest.raises(UnsupportedCheckpoint, match="norm='pre'"):
        marian_export.hf_config(tiny_config(norm="pre"))


def test_a_pre_norm_checkpoint_with_final_norms_imports_as_pre_norm(hf_dir: Path, tmp_path: Path) -> None:
    """transformers 3 wrote such checkpoints (Marian was BART then); the final norms must be present."""
    src = edited_copy(hf_dir, tmp_path / "hf", "config.json", {"normalize_before": True, "add_final_layer_norm": True})
    weights = marian.load_weights(src)
    for stack in ("encoder", "decoder"):
        weights[f"model.{stack}.layer_norm.weight"] = torch.full((32,), 2.0)
        weights[f"model.{stack}.layer_norm.bias"] = torch.zeros(32)
    save_file(weights, str(src / "model.safetensors"))
    model = checkpoint.load(marian.import_marian(src, tmp_path / "out"), device="cpu").model
    assert model.cfg.norm == "pre" and torch.equal(model.decoder_norm.weight, torch.full((32,), 2.0))


def test_command_line(hf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def run(add: Any, main: Any, *argv: str) -> int:
        parser = argparse.ArgumentParser()
        add(parser)
        return int(main(parser.parse_args(list(argv))))

    out = tmp_path / "en-pt"
    assert run(argos.add_import_arguments, argos.import_main, str(hf_dir), str(out)) == 0
    assert checkpoint.ModelInfo.load(out / "info.json").target_language == "pt"
    assert run(argos.add_import_arguments, argos.import_main, str(hf_dir), str(out)) == 1  # not empty
    assert "--force" in capsys.readouterr().err
    assert run(marian.add_export_arguments, marian.export_main, str(out), str(tmp_path / "hf")) == 0
    bad = edited_copy(hf_dir, tmp_path / "bad", "config.json", {"activation_function": "tanh"})
    assert run(argos.add_import_arguments, argos.import_main, str(bad), str(tmp_path / "x")) == 1
    assert "activation_function" in capsys.readouterr().err


def test_streamed_text_equals_decoded_text(imported: checkpoint.LoadedModel) -> None:
    for ids in tolk_generate(imported, sample_texts(12), beam_size=1):
        detok = imported.tokenizer.detokenizer()
        streamed = "".join(detok.push(t) for t in ids) + detok.flush()
        assert streamed == imported.tokenizer.decode(ids)


@pytest.fixture(scope="module")
def copying(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    """A separate-vocabulary checkpoint with random weights, imported by `tolk import`: its greedy outputs are full of
    pieces only the source's SentencePiece model knows ("▁paste" repeated), as a real model's are whenever it copies
    a name or term from the source."""
    base = tmp_path_factory.mktemp("copying")
    directory = build_hf_dir(base / "hf", seed=3, steps=0)
    parser = argparse.ArgumentParser()
    argos.add_import_arguments(parser)
    assert argos.import_main(parser.parse_args([str(directory), str(base / "tolk")])) == 0
    return base / "tolk", *load_hf(directory)


def test_pieces_only_the_source_knows_are_written_as_transformers_writes_them(copying: tuple[Path, Any, Any]) -> None:
    out, model, tokenizer = copying
    loaded = checkpoint.load(out, device="cpu")
    texts = source_lines(24, seed=9)
    ids = hf_generate(model, tokenizer, texts, num_beams=1, max_length=12)
    assert tolk_generate(loaded, texts, beam_size=1, max_new_tokens=10) == ids
    target_pieces = set(marian_format.spm_pieces(out / "target.spm"))
    copied = [i for i in ids if any(loaded.tokenizer.vocab[t] not in target_pieces for t in i)]  # type: ignore[index]
    assert len(copied) >= 3  # the case this test is about
    for row in ids:
        theirs = tokenizer.decode(row, skip_special_tokens=True)
        assert loaded.tokenizer.decode(row) == theirs
        assert "\u2581" not in theirs
        detok = loaded.tokenizer.detokenizer()
        assert "".join(detok.push(t) for t in row) + detok.flush() == theirs


def test_the_server_answers_transformers_text(copying: tuple[Path, Any, Any]) -> None:
    from fastapi.testclient import TestClient

    from server.app import create_app

    out, model, tokenizer = copying
    texts = source_lines(8, seed=9)
    # the vocabulary has >>por<< and >>spa<<: the server starts each source with the target's token, as it must
    ids = hf_generate(model, tokenizer, [f">>por<< {t}" for t in texts], num_beams=1, max_length=12)
    with TestClient(create_app(server_settings(out))) as client:
        r = client.post("/translate", json={"q": texts, "source": "en", "target": "pt",
                                            "options": {"max_new_tokens": 10, "beam_size": 1}})
    assert r.status_code == 200, r.text
    assert r.json()["translatedText"] == [tokenizer.decode(row, skip_special_tokens=True) for row in ids]
