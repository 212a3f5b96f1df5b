"""CTranslate2 import: a tiny Tolk model converted with CTranslate2's own spec classes and serializer (as
bench/ct2_convert.py does), imported back, translates token for token as ctranslate2.Translator does on the same
files; int8 models give the same sentence for at least 95% of sources; what Tolk cannot compute is refused."""

from __future__ import annotations

import argparse
import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from model import checkpoint
from model.ct2_format import read_model_bin
from model.ct2_import import import_ct2
from model.generation import GenerationConfig
from model.marian_format import UnsupportedCheckpoint
from model.search import generate
from tests.helpers import MAX_LEN, build_hf_dir, load_hf, source_lines, to_ct2, translations, with_config
from tests.tiny import corpus_lines, tiny_config, tiny_model

ctranslate2 = pytest.importorskip("ctranslate2")

pytestmark = pytest.mark.slow  # parity with CTranslate2

INFO = checkpoint.ModelInfo("ct2-en-pt", "en", "pt")


def inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for j, p in enumerate(perm):
        inv[p] = j
    return inv


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return corpus_lines(40, seed=7)


@pytest.mark.parametrize("beam", [1, 4])
def test_imported_model_translates_as_ctranslate2(tiny_model_dir: Path, tmp_path: Path, lines: list[str],
                                                  beam: int) -> None:
    ct2_dir = to_ct2(tiny_model_dir, tmp_path / "ct2")
    out = import_ct2(ct2_dir, tmp_path / "tolk", INFO)
    assert not (out / "vocab.json").exists()  # CTranslate2's ids are SentencePiece's here
    original, imported = checkpoint.load(tiny_model_dir, device="cpu"), checkpoint.load(out, device="cpu")
    for key, value in original.model.state_dict().items():
        assert imported.model.state_dict()[key].equal(value), key
    ours, theirs = translations(out, ct2_dir, beam, lines)
    assert ours == theirs


def test_vocabulary_numbered_as_opennmt_py(tiny_model_dir: Path, tmp_path: Path, lines: list[str]) -> None:
    """Ids that are not SentencePiece's own (OpenNMT-py's numbering, pad named <blank>, a .txt vocabulary as older
    CTranslate2 versions wrote): vocab.json keeps the pieces, and the import translates as CTranslate2 does."""
    ct2_dir = to_ct2(tiny_model_dir, tmp_path / "ct2", onmt_vocab="source+target")
    pieces = json.loads((ct2_dir / "shared_vocabulary.json").read_text())
    (ct2_dir / "shared_vocabulary.json").unlink()
    (ct2_dir / "shared_vocabulary.txt").write_text("\n".join(pieces) + "\n")
    out = import_ct2(ct2_dir, tmp_path / "tolk", INFO)
    meta = checkpoint.read_meta(out)
    assert json.loads((out / "vocab.json").read_text())[:4] == ["<unk>", "<blank>", "<s>", "</s>"]
    assert (meta.cfg.unk_id, meta.cfg.pad_id, meta.cfg.bos_id, meta.cfg.eos_id) == (0, 1, 2, 3)
    for beam in (1, 4):
        ours, theirs = translations(out, ct2_dir, beam, lines)
        assert ours == theirs


def test_separate_vocabularies(tiny_model_dir: Path, tmp_path: Path, lines: list[str]) -> None:
    """A source vocabulary numbered otherwise than the target's: source_vocab.json beside vocab.json, separate
    embedding tables, and the same translations as CTranslate2's."""
    ct2_dir = to_ct2(tiny_model_dir, tmp_path / "ct2", onmt_vocab="source")
    assert (ct2_dir / "source_vocabulary.json").is_file() and (ct2_dir / "target_vocabulary.json").is_file()
    out = import_ct2(ct2_dir, tmp_path / "tolk", INFO)
    meta = checkpoint.read_meta(out)
    assert not meta.cfg.share_embeddings and (out / "source_vocab.json").is_file()
    assert meta.tokenizer.encode("")[-1] == 3  # the source's own end-of-sentence id
    for beam in (1, 4):
        ours, theirs = translations(out, ct2_dir, beam, lines)
        assert ours == theirs


def test_a_vocabulary_without_padding_gets_one(tiny_model_dir: Path, tmp_path: Path, lines: list[str]) -> None:
    """No pad piece (CTranslate2's conversion of Marian models drops it): a zero row is appended as Tolk's padding,
    never generated, so the translations stay CTranslate2's."""
    ct2_dir = to_ct2(tiny_model_dir, tmp_path / "ct2", onmt_vocab="no pad")
    out = import_ct2(ct2_dir, tmp_path / "tolk", INFO)
    meta = checkpoint.read_meta(out)
    size = len(json.loads((ct2_dir / "shared_vocabulary.json").read_text()))
    assert meta.cfg.pad_id == size and meta.cfg.tgt_vocab_size == size + 1
    assert json.loads((out / "vocab.json").read_text())[-1] == "<pad>"
    ours, theirs = translations(out, ct2_dir, 1, lines)
    assert ours == theirs


def test_pre_norm_model_scores_as_ctranslate2(tiny_model_dir: Path, tmp_path: Path, lines: list[str]) -> None:
    """A pre-norm model (OpenNMT-py's and so Argos's layout) imported from CTranslate2 gives every target token the
    log-probability CTranslate2's score_batch gives it, teacher-forced on the same files."""
    meta = checkpoint.read_meta(tiny_model_dir)
    model = tiny_model(tiny_config(vocab_size=meta.cfg.src_vocab_size, norm="pre", activation="relu"))
    checkpoint.save(tmp_path / "pre", model, INFO, tiny_model_dir / "source.spm", tiny_model_dir / "target.spm")
    ct2_dir = to_ct2(tmp_path / "pre", tmp_path / "ct2")
    imported = checkpoint.load(import_ct2(ct2_dir, tmp_path / "tolk", INFO), device="cpu")
    assert imported.model.cfg.norm == "pre"
    tok, cfg = imported.tokenizer, imported.model.cfg
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32")
    targets = [tok.source.encode(line)[:12] for line in lines[:10]]
    scores = translator.score_batch([tok.source.encode(line, out_type=str) for line in lines[:10]],
                                    [tok.pieces(t) for t in targets])
    for line, target, theirs in zip(lines, targets, scores, strict=False):
        with torch.no_grad():
            logits = imported.model(torch.tensor([tok.encode(line)]), torch.tensor([[cfg.decoder_start_id, *target]]))
        lp = torch.log_softmax(logits[0], -1)
        ours = [lp[i, t].item() for i, t in enumerate([*target, cfg.eos_id])]
        assert ours == pytest.approx(theirs.log_probs, abs=1e-4)


def test_source_without_eos_as_ctranslate2(tiny_model_dir: Path, tmp_path: Path, lines: list[str]) -> None:
    model_dir = with_config(tiny_model_dir, tmp_path / "no-eos", add_source_eos=False)
    ct2_dir = to_ct2(model_dir, tmp_path / "ct2")
    assert json.loads((ct2_dir / "config.json").read_text())["add_source_eos"] is False
    out = import_ct2(ct2_dir, tmp_path / "tolk", INFO)
    meta = checkpoint.read_meta(out)
    assert not meta.cfg.add_source_eos and meta.tokenizer.encode(lines[0])[-1] != meta.cfg.eos_id
    ours, theirs = translations(out, ct2_dir, 1, lines)
    assert ours == theirs
    with_eos, _ = translations(tiny_model_dir, ct2_dir, 1, lines)
    assert with_eos != ours  # the flag changes what the model sees


def test_source_with_bos_as_ctranslate2(tiny_model_dir: Path, tmp_path: Path, lines: list[str]) -> None:
    model_dir = with_config(tiny_model_dir, tmp_path / "bos", add_source_bos=True)
    ct2_dir = to_ct2(model_dir, tmp_path / "ct2")
    out = import_ct2(ct2_dir, tmp_path / "tolk", INFO)
    meta = checkpoint.read_meta(out)
    assert meta.cfg.add_source_bos and meta.tokenizer.encode(lines[0])[0] == meta.cfg.bos_id
    ours, theirs = translations(out, ct2_dir, 1, lines)
    assert ours == theirs


def test_interleaved_positions_are_permuted_into_tolks(tiny_model_dir: Path, tmp_path: Path,
                                                       lines: list[str]) -> None:
    """OpenNMT-py's table interleaves sines and cosines: the import permutes the hidden dimension back."""
    d = checkpoint.read_meta(tiny_model_dir).cfg.d_model
    perm = [2 * j for j in range(d // 2)] + [2 * j + 1 for j in range(d // 2)]
    onmt = with_config(tiny_model_dir, tmp_path / "onmt", perm=inverse(perm))
    ct2_dir = to_ct2(onmt, tmp_path / "ct2", interleave=inverse(perm))
    out = import_ct2(ct2_dir, tmp_path / "tolk", INFO)
    original, imported = checkpoint.load(tiny_model_dir, device="cpu"), checkpoint.load(out, device="cpu")
    for key, value in original.model.state_dict().items():
        assert imported.model.state_dict()[key].equal(value), key
    ours, theirs = translations(out, ct2_dir, 1, lines)
    assert ours == theirs


@pytest.mark.parametrize("quantization", ["int8", "int16", "float16"])
def test_quantized_weights_are_read_as_ctranslate2_reads_them(tiny_model_dir: Path, tmp_path: Path,
                                                              quantization: str) -> None:
    """Stored int8 / int16 (with their scales), float16 or bfloat16: the import's float32 weights are the ones
    CTranslate2 computes with in float32, token for token.

    CTranslate2's own int8 arithmetic (activations quantized too) is another matter: on this tiny model it does not
    even agree with CTranslate2's float32 arithmetic on the same file, so the test cannot measure Tolk against it.
    """
    stored = {"int8": torch.int8, "int16": torch.int16, "float16": torch.float16}[quantization]
    ct2_dir = to_ct2(tiny_model_dir, tmp_path / "ct2", quantization=quantization)
    _, _, raw = read_model_bin(ct2_dir / "model.bin")
    assert any(t.dtype == stored for t in raw.values())
    out = import_ct2(ct2_dir, tmp_path / "tolk", INFO)
    lines = corpus_lines(40, seed=11)
    ours, theirs = translations(out, ct2_dir, 1, lines, compute_type="float32")
    # Two float32 engines sum in different orders (and CPUs): a greedy choice between two pieces that CTranslate2
    # itself scores within a rounding error of each other may go either way. Any other difference is a wrong weight.
    ties = [gap for gap in first_step_gaps(ct2_dir, lines, ours, theirs) if gap > 0]
    assert all(gap < 1e-3 for gap in ties), ties
    assert len(ties) <= 2, f"{len(ties)} of {len(lines)} lines part ways"


def first_step_gaps(ct2_dir: Path, lines: list[str], ours: list[Any], theirs: list[Any]) -> list[float]:
    """For each line, 0 when both engines chose the same pieces, else how far apart CTranslate2's float32 log
    probabilities of the two pieces are at the first step where the choices part."""
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32")
    tok = checkpoint.load(ct2_dir.parent / "tolk", device="cpu").tokenizer
    gaps = []
    for line, a, b in zip(lines, ours, theirs, strict=True):
        if a == b:
            gaps.append(0.0)
            continue
        step = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        source = [tok.source.encode(line, out_type=str)] * 2
        scored = translator.score_batch(source, [a, b])
        gaps.append(abs(scored[0].log_probs[step] - scored[1].log_probs[step]))
    return gaps


@pytest.mark.parametrize("quantization", ["int8_float16", "bfloat16"])
def test_half_precision_models_give_the_same_sentences(tiny_model_dir: Path, tmp_path: Path,
                                                       quantization: str) -> None:
    """With float16 biases and norms beside int8 weights, or everything in bfloat16 (the position table included,
    which Tolk computes in float32), CTranslate2's float32 arithmetic widens other roundings than the import's:
    the same sentence for at least 95% of sources."""
    ct2_dir = to_ct2(tiny_model_dir, tmp_path / "ct2", quantization=quantization)
    out = import_ct2(ct2_dir, tmp_path / "tolk", INFO)
    lines = corpus_lines(100, seed=11)
    ours, theirs = translations(out, ct2_dir, 1, lines, compute_type="float32")
    same = sum(a == b for a, b in zip(ours, theirs, strict=True)) / len(lines)
    print(f"{quantization}: {same:.0%} the same")
    assert same >= 0.95, same


def write_model_bin(path: Path, spec: str, revision: int, variables: dict[str, torch.Tensor]) -> None:
    """CTranslate2's binary layout (version 6), for variants its spec classes cannot express."""
    types = {torch.float32: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.float16: 4}

    def string(s: str) -> bytes:
        return struct.pack("<H", len(s) + 1) + s.encode() + b"\0"

    data = struct.pack("<I", 6) + string(spec) + struct.pack("<II", revision, len(variables))
    for name, t in variables.items():
        raw = t.contiguous().numpy().tobytes()
        data += string(name) + struct.pack("<B", t.dim()) + b"".join(struct.pack("<I", n) for n in t.shape)
        data += struct.pack("<BI", types[t.dtype], len(raw)) + raw
    path.write_bytes(data + struct.pack("<I", 0))


@pytest.mark.parametrize("change, message", [
    (lambda v: v.update({"encoder/layer_0/self_attention/relative_position_keys": torch.zeros(4, 8)}),
     "relative position"),
    (lambda v: [v.pop(k) for k in list(v) if "position_encodings" in k], "no encoder position table"),
    (lambda v: v.update({"decoder/layer_0/ffn/linear_0_noact/weight": torch.zeros(4, 4)}), "gated"),
    (lambda v: v.update({f"{s}/activation": torch.tensor(1, dtype=torch.int8) for s in ("encoder", "decoder")}),
     "activation 1"),
    (lambda v: v.update({"decoder/something_new": torch.zeros(3)}), "no place for"),
])
def test_what_tolk_cannot_compute_is_refused(tiny_model_dir: Path, tmp_path: Path, change: Any,
                                             message: str) -> None:
    ct2_dir = to_ct2(tiny_model_dir, tmp_path / "ct2")
    spec, revision, variables = read_model_bin(ct2_dir / "model.bin")
    change(variables)
    write_model_bin(ct2_dir / "model.bin", spec, revision, variables)
    with pytest.raises(UnsupportedCheckpoint, match=message):
        import_ct2(ct2_dir, tmp_path / "tolk", INFO)


def test_decoder_only_truncated_and_incomplete_directories_are_refused(tiny_model_dir: Path,
                                                                      tmp_path: Path) -> None:
    ct2_dir = to_ct2(tiny_model_dir, tmp_path / "ct2")
    whole = (ct2_dir / "model.bin").read_bytes()
    write_model_bin(ct2_dir / "model.bin", "TransformerDecoderSpec", 8, {})
    with pytest.raises(UnsupportedCheckpoint, match="decoder-only"):
        import_ct2(ct2_dir, tmp_path / "a", INFO)
    (ct2_dir / "model.bin").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(UnsupportedCheckpoint, match="truncated"):
        import_ct2(ct2_dir, tmp_path / "b", INFO)
    (ct2_dir / "model.bin").write_bytes(whole)
    (ct2_dir / "sentencepiece.model").unlink()
    with pytest.raises(FileNotFoundError, match="SentencePiece"):
        import_ct2(ct2_dir, tmp_path / "c", INFO)


def test_old_revisions_take_the_heads_from_the_spec_name(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Spec revision 2 stores no head count: TransformerBase has 8, TransformerBig 16 (as CTranslate2 reads them);
    revision 1 (OpenNMT-tf's variable names) is refused."""
    ct2_dir = to_ct2(tiny_model_dir, tmp_path / "ct2")
    _, _, variables = read_model_bin(ct2_dir / "model.bin")
    old = {k: v for k, v in variables.items() if not k.endswith("num_heads")}
    write_model_bin(ct2_dir / "model.bin", "TransformerBig", 2, old)
    assert checkpoint.read_meta(import_ct2(ct2_dir, tmp_path / "big", INFO)).cfg.n_heads == 16
    write_model_bin(ct2_dir / "model.bin", "TransformerSpec", 1, old)
    with pytest.raises(UnsupportedCheckpoint, match="revision 1 is too old"):
        import_ct2(ct2_dir, tmp_path / "v1", INFO)


@pytest.fixture(scope="module")
def marian_conversion(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    """A tiny OPUS-MT-style checkpoint converted by CTranslate2's own TransformersConverter (decoder/
    start_from_zero_embedding set, <pad> dropped, as for every Marian model), and its `tolk import`."""
    from model import argos

    base = tmp_path_factory.mktemp("ct2-marian")
    hf_dir = build_hf_dir(base / "hf")
    ct2_dir = base / "ct2"
    ctranslate2.converters.TransformersConverter(str(hf_dir)).convert(str(ct2_dir), force=True)
    for name in ("source.spm", "target.spm"):
        shutil.copyfile(hf_dir / name, ct2_dir / name)
    parser = argparse.ArgumentParser()
    argos.add_import_arguments(parser)
    assert argos.import_main(parser.parse_args([str(ct2_dir), str(base / "tolk")])) == 0
    return ct2_dir, base / "tolk", load_hf(hf_dir)[1]


@pytest.mark.parametrize("beam", [1, 4])
def test_a_marian_conversion_translates_as_ctranslate2(marian_conversion: tuple[Path, Path, Any], beam: int) -> None:
    """Token for token in float32, CTranslate2 given the source as its Marian guide does (transformers' tokens,
    </s> included). CTranslate2 never ends before a first token (min_decoding_length=1 by default): Tolk is asked
    the same."""

    ct2_dir, out, tokenizer = marian_conversion
    flags = read_model_bin(ct2_dir / "model.bin")[2]
    assert flags["decoder/start_from_zero_embedding"].item() == 1
    lines = source_lines(40, seed=7)
    loaded = checkpoint.load(out, device="cpu")
    tok = loaded.tokenizer
    config = GenerationConfig(beam_size=beam, max_new_tokens=MAX_LEN, length_penalty=0.0, min_new_tokens=1)
    ours = [tok.pieces(h[0].tokens) for h in generate(loaded.net, [tok.encode(s) for s in lines], config)]
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32")
    sources = [tokenizer.convert_ids_to_tokens(tokenizer.encode(s)) for s in lines]
    assert [[tok.pieces([i])[0] for i in tok.encode(s)] for s in lines] == sources
    results = translator.translate_batch(sources, beam_size=beam, max_decoding_length=MAX_LEN, length_penalty=0.0)
    theirs = [r.hypotheses[0] for r in results]
    assert ours == theirs
    assert len({len(t) for t in theirs}) >= 4  # translations of varied lengths: the comparison is not trivial
