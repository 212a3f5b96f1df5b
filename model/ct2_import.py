"""Import of CTranslate2 Transformer models (Argos / LibreTranslate packages among them) into Tolk's format.

A CTranslate2 model directory holds model.bin (CTranslate2's binary format: a version, the spec's name and revision,
named tensors, then aliases), config.json (special tokens, add_source_bos/eos, layer_norm_epsilon), the vocabularies
(shared_vocabulary.json or .txt, else source_ and target_vocabulary) and, beside it, the SentencePiece model(s).
Nothing here needs ctranslate2: the files are read directly (model/ct2_format.py).

Weights stored in float16 or bfloat16 are widened to float32; int8 (and int16) weights are dequantised with their
scales (CTranslate2 stores round(w * scale) with scale = 127 / max|row|), which is as close as float32 gets to what
CTranslate2 computes with them. Ids stay CTranslate2's: vocab.json (and source_vocab.json when the sides differ)
keeps the pieces unless they are exactly the SentencePiece models' own.

Positions: Tolk adds the [sin | cos] sinusoid of Marian. OpenNMT-py (so Argos) stores its own table, whose sines and
cosines interleave; the import then permutes the model's hidden dimension (every weight that reads or writes the
residual stream, and the layer norms), which computes the same function with Tolk's table. CTranslate2's own
sinusoid (used when model.bin stores none: OpenNMT-tf models) starts at position 1 with other frequencies, and
learned tables are not sinusoids at all: both are refused, as is everything else Tolk cannot compute (relative
positions, rotary or ALiBi, gated or RMS-normalised layers, multi-query attention, several source embeddings,
decoder-only models). Alignment heads only matter for CTranslate2's alignment output and are ignored.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm
import torch
from torch import Tensor

from model import checkpoint
from model.config import ModelConfig
from model.ct2_format import dequantized, find_spm, read_model_bin, read_vocabularies
from model.layers import sinusoidal_table
from model.marian_format import UnsupportedCheckpoint, read_json, spm_pieces
from model.transformer import Transformer

SPECS = {"TransformerSpec": 8, "TransformerBase": 8, "TransformerBig": 16}  # encoder-decoder specs: default heads
ACTIVATIONS = {0: "relu", 2: "swish", 3: "gelu"}  # CTranslate2's Activation enum; GELUTanh and others refused
PAD_PIECES = ("<blank>", "<pad>")
# Flags Tolk ignores, or accepts only when false/absent; anything else left over after the mapping is refused.
IGNORED = re.compile(r"^((en|de)coder/)?(num_heads|pre_norm|activation|embeddings_merge|alignment_layer|"
                     r"alignment_heads|scale_embeddings|multiply_by_sqrt_depth)$|/multiply_by_sqrt_depth$")
MUST_BE_OFF = ("alibi", "alibi_use_positive_positions", "scale_alibi", "multi_query_attention")
UNSUPPORTED = {  # a variable's name -> what it means, for the error message
    "relative_position": "relative position representations", "relative_attention_bias": "relative attention bias",
    "rotary": "rotary position embeddings", "linear_0_noact": "gated feed-forward layers (GLU)",
    "layernorm_embedding": "a layer norm after the embeddings", "layer_norm_use_residual": "RMS layer norms",
    "num_heads_kv": "multi-query / grouped-query attention", "embeddings_1": "several source embeddings (features)",
    "weight_zero": "AWQ quantization", "project_in": "projections around the decoder",
    "queries_scale": "a custom attention scale", "scale_outputs": "scaled outputs", "q_norm": "query/key norms",
    "input_layer_norm": "extra layer norms", "sliding_window": "sliding-window attention",
    "final_logit_softcapping": "logit soft-capping", "layer_scalar": "layer scalars",
}


def positions_permutation(table: Tensor, stored: torch.dtype) -> list[int] | None:
    """None when a stored position table is Tolk's [sin | cos] sinusoid; the permutation of the hidden dimension
    that turns it into Tolk's when it interleaves sines and cosines (OpenNMT-py); else refused."""
    P, d = table.shape
    ours = sinusoidal_table(P, d)
    # float32 tables computed elsewhere round pos * frequency differently: 1e-3 covers position 5000; a table stored
    # in float16 or bfloat16 is as close as its precision allows
    atol = max(1e-3, torch.finfo(stored).eps) if stored.is_floating_point else 1e-3
    if torch.allclose(table, ours, atol=atol):
        return None
    perm = [2 * j for j in range(d // 2)] + [2 * j + 1 for j in range(d // 2)]
    if torch.allclose(table[:, perm], ours, atol=atol):
        return perm
    raise UnsupportedCheckpoint("the position table is neither Tolk's sinusoid nor OpenNMT-py's (learned positions?)")


def permute_hidden(weights: dict[str, Tensor], perm: list[int]) -> dict[str, Tensor]:
    """Reorder the residual stream's dimensions: inputs of projections reading it, outputs of those writing it."""
    index = torch.tensor(perm)
    reads = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "fc1.weight")
    writes = ("attn.out_proj.weight", "attn.out_proj.bias", "fc2.weight", "fc2.bias")
    out = {}
    for name, w in weights.items():
        if name.endswith(reads) or name in ("src_embed.weight", "tgt_embed.weight", "out_proj.weight"):
            w = w.index_select(1, index)
        elif name.endswith(writes) or "norm." in name:
            w = w.index_select(0, index)
        out[name] = w
    return out


class Variables:
    """model.bin's float variables, each taken once; what is left at the end has no place in Tolk."""

    def __init__(self, variables: dict[str, Tensor]) -> None:
        self.left = dict(variables)
        self.all = variables

    def take(self, name: str, default: Tensor | None = None) -> Tensor:
        if name not in self.all:
            if default is not None:
                return default
            raise UnsupportedCheckpoint(f"model.bin has no variable {name}")
        self.left.pop(name, None)
        return self.all[name]

    def flag(self, scope: str, name: str, default: float) -> float:
        """A scalar attribute of a scope, or of the whole model (spec revisions before 5 keep them there)."""
        for key in (f"{scope}/{name}", name):
            if key in self.all:
                self.left.pop(key, None)
                return float(self.all[key].item())
        return default

    def linear(self, scope: str, parts: int = 1) -> list[tuple[Tensor, Tensor]]:
        """A linear layer's weight and bias (zeros when it has none), split along the output into parts."""
        w = self.take(f"{scope}/weight")
        b = self.take(f"{scope}/bias", torch.zeros(w.shape[0]))
        return list(zip(w.chunk(parts), b.chunk(parts), strict=True))

    def norm(self, scope: str) -> tuple[Tensor, Tensor]:
        return self.take(f"{scope}/gamma"), self.take(f"{scope}/beta")


def layer_weights(v: Variables, stack: str, i: int) -> dict[str, Tensor]:
    """Tolk's weights of one encoder or decoder layer."""
    scope, ours = f"{stack}/layer_{i}", f"{stack}.{i}"
    out: dict[str, Tensor] = {}

    def put(name: str, wb: tuple[Tensor, Tensor]) -> None:
        out[f"{ours}.{name}.weight"], out[f"{ours}.{name}.bias"] = wb

    for proj, wb in zip(("q_proj", "k_proj", "v_proj"), v.linear(f"{scope}/self_attention/linear_0", 3), strict=True):
        put(f"self_attn.{proj}", wb)
    put("self_attn.out_proj", v.linear(f"{scope}/self_attention/linear_1")[0])
    put("self_res.norm", v.norm(f"{scope}/self_attention/layer_norm"))
    if stack == "decoder":
        put("cross_attn.q_proj", v.linear(f"{scope}/attention/linear_0")[0])
        k, val = v.linear(f"{scope}/attention/linear_1", 2)
        put("cross_attn.k_proj", k)
        put("cross_attn.v_proj", val)
        put("cross_attn.out_proj", v.linear(f"{scope}/attention/linear_2")[0])
        put("cross_res.norm", v.norm(f"{scope}/attention/layer_norm"))
    put("ff.fc1", v.linear(f"{scope}/ffn/linear_0")[0])
    put("ff.fc2", v.linear(f"{scope}/ffn/linear_1")[0])
    put("ff_res.norm", v.norm(f"{scope}/ffn/layer_norm"))
    return out


def check_supported(spec: str, revision: int, variables: dict[str, Tensor]) -> None:
    if spec not in SPECS:
        kind = "a decoder-only (language) model" if "Decoder" in spec else f"a {spec} model"
        raise UnsupportedCheckpoint(f"this CTranslate2 model is {kind}; Tolk imports encoder-decoder Transformers "
                                    f"(TransformerSpec) only")
    if revision < 2:  # revision 1 names its variables as OpenNMT-tf did
        raise UnsupportedCheckpoint(f"spec revision {revision} is too old: convert the model again with a recent "
                                    "CTranslate2")
    for name in variables:
        for key, meaning in UNSUPPORTED.items():
            if key in name:
                raise UnsupportedCheckpoint(f"the model uses {meaning} ({name}), which Tolk does not compute")
    for name, value in variables.items():
        if name.rsplit("/", 1)[-1] in MUST_BE_OFF and value.dim() == 0 and value.item():
            raise UnsupportedCheckpoint(f"{name} is set, which Tolk does not compute")
        if "position_encodings" in name and not name.endswith("position_encodings/encodings"):
            raise UnsupportedCheckpoint(f"unknown position encoding variable {name}")


def positions(v: Variables, raw: dict[str, Tensor]) -> tuple[int, list[int] | None]:
    """The position table's length, and the permutation that makes it Tolk's (`positions_permutation`)."""
    name = "{}/position_encodings/encodings"
    for stack in ("encoder", "decoder"):
        if name.format(stack) not in v.all:
            raise UnsupportedCheckpoint(f"model.bin stores no {stack} position table: CTranslate2's own sinusoid "
                                        "(OpenNMT-tf's) starts at position 1 with other frequencies, which Tolk "
                                        "does not compute")
    table = v.take(name.format("encoder"))
    if not torch.equal(table, v.take(name.format("decoder"))):
        raise UnsupportedCheckpoint("the encoder and decoder position tables differ")
    return table.shape[0], positions_permutation(table, raw[name.format("encoder")].dtype)


def embedding_scale(v: Variables, stack: str, table: str, d: int) -> float:
    """CTranslate2's embedding scale: a flag (true: sqrt(d)), a value, or absent (sqrt(d))."""
    for name in (f"{stack}/scale_embeddings", f"{table}/multiply_by_sqrt_depth"):
        if name in v.all:
            v.left.pop(name, None)
            value = v.all[name]
            if value.dtype == torch.int8:
                return math.sqrt(d) if value.item() else 1.0
            return float(value.float().item())
    return math.sqrt(d)


def model_weights(v: Variables, layers: tuple[int, int], d: int) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Tolk's weights (src/tgt tables before any sharing) and the config fields they decide."""
    src_name = "encoder/embeddings_0" if "encoder/embeddings_0/weight" in v.all else "encoder/embeddings"
    src, tgt = v.take(f"{src_name}/weight"), v.take("decoder/embeddings/weight")
    scales = embedding_scale(v, "encoder", src_name, d), embedding_scale(v, "decoder", "decoder/embeddings", d)
    root = np.float32(math.sqrt(d))
    if all(np.float32(s) == root for s in scales):
        scale_embedding = True
    else:  # a scale other than sqrt(d) is folded into the tables: the same float32 products
        scale_embedding = False
        src, tgt = src * np.float32(scales[0]).item(), tgt * np.float32(scales[1]).item()
    weights = {"src_embed.weight": src, "tgt_embed.weight": tgt}
    for stack, n in zip(("encoder", "decoder"), layers, strict=True):
        for i in range(n):
            weights.update(layer_weights(v, stack, i))
    pre = bool(v.flag("encoder", "pre_norm", 1.0))
    if pre != bool(v.flag("decoder", "pre_norm", 1.0)):
        raise UnsupportedCheckpoint("the encoder and decoder differ in pre_norm")
    if pre:
        for stack in ("encoder", "decoder"):
            if f"{stack}/layer_norm/gamma" not in v.all:
                raise UnsupportedCheckpoint(f"a pre-norm {stack} without its final layer norm")
            weights[f"{stack}_norm.weight"], weights[f"{stack}_norm.bias"] = v.norm(f"{stack}/layer_norm")
    weights["out_proj.weight"] = v.take("decoder/projection/weight")
    if "decoder/projection/bias" in v.all:
        weights["out_bias"] = v.take("decoder/projection/bias")
    fields = {"norm": "pre" if pre else "post", "scale_embedding": scale_embedding}
    return weights, fields


def settings(v: Variables, weights: dict[str, Tensor], d: int, default_heads: int) -> dict[str, Any]:
    """Heads, activation and feed-forward width, which Tolk holds once for both stacks (revision 2 stores no heads:
    the spec's name says them, as CTranslate2 reads it)."""
    heads = {int(v.flag(s, "num_heads", default_heads)) for s in ("encoder", "decoder")}
    activations = {int(v.flag(s, "activation", 0.0)) for s in ("encoder", "decoder")}
    widths = {w.shape[0] for name, w in weights.items() if name.endswith("ff.fc1.weight")}
    if len(heads) != 1 or len(activations) != 1 or len(widths) != 1:
        raise UnsupportedCheckpoint("the encoder and decoder differ in heads, activation or feed-forward width")
    activation = activations.pop()
    if activation not in ACTIVATIONS:
        raise UnsupportedCheckpoint(f"activation {activation} of CTranslate2's enum is not supported "
                                    f"(relu, gelu, swish)")
    return {"n_heads": heads.pop(), "activation": ACTIVATIONS[activation], "d_ff": widths.pop(), "d_model": d}


def with_pad(source: list[str], target: list[str], weights: dict[str, Tensor]) -> tuple[list[str], list[str], int]:
    """The padding id; a zero row appended to both sides when the vocabularies have no padding piece (CTranslate2's
    Marian conversion drops it). Tolk never generates it, so the extra row changes no score."""
    for piece in PAD_PIECES:
        if piece in target:
            pad = target.index(piece)
            if pad >= len(source) or source[pad] != piece:
                raise UnsupportedCheckpoint(f"the source vocabulary has no {piece!r} at id {pad}, as the target has")
            return source, target, pad
    if len(source) != len(target):
        raise UnsupportedCheckpoint("the vocabularies have no padding piece, and differ in size")
    for name in ("src_embed.weight", "tgt_embed.weight", "out_proj.weight", "out_bias"):
        if name in weights:
            w = weights[name]
            weights[name] = torch.cat([w, w.new_zeros((1, *w.shape[1:]))])
    return [*source, "<pad>"], [*target, "<pad>"], len(target)


def zero_start(source: list[str], target: list[str], weights: dict[str, Tensor], pad: int
               ) -> tuple[list[str], list[str], int]:
    """The id of a target row of zeros for the decoder to start from (CTranslate2's start_from_zero_embedding, which
    its Marian converters set): the padding row when it is zero (as with_pad adds it), else a zero row added to
    every table. A zero row scaled is still zero, so the first step is CTranslate2's; the start is never generated."""
    if not weights["tgt_embed.weight"][pad].any():
        return source, target, pad
    for name in ("src_embed.weight", "tgt_embed.weight", "out_proj.weight", "out_bias"):
        if name in weights:
            w = weights[name]
            weights[name] = torch.cat([w, w.new_zeros((1, *w.shape[1:]))])
    return [*source, "<start>"], [*target, "<start>"], len(target)


def token_ids(config: dict[str, Any], target: list[str]) -> dict[str, Any]:
    """config.json's special tokens as Tolk's ids."""

    def find(field: str, default: str | None) -> int:
        piece = config.get(field, default)
        if piece is None:
            raise UnsupportedCheckpoint(f"config.json {field} is null (the caller would give it): not supported")
        if piece not in target:
            raise UnsupportedCheckpoint(f"config.json {field}={piece!r} is not in the target vocabulary")
        return target.index(piece)

    eos, bos = find("eos_token", "</s>"), config.get("bos_token", "<s>")
    bos_id = target.index(bos) if bos in target and target.index(bos) != eos else -1
    add_bos = bool(config.get("add_source_bos", False))
    if add_bos and bos_id < 0:
        raise UnsupportedCheckpoint("config.json add_source_bos needs a bos_token distinct from eos_token")
    return {"eos_id": eos, "unk_id": find("unk_token", "<unk>"), "decoder_start_id": find("decoder_start_token", "<s>"),
            "bos_id": bos_id, "add_source_bos": add_bos, "add_source_eos": bool(config.get("add_source_eos", False)),
            "layer_norm_eps": float(config.get("layer_norm_epsilon") or 1e-5)}


def import_ct2(src_dir: Path | str, out_dir: Path | str, info: checkpoint.ModelInfo,
               spms: tuple[Path, Path] | None = None, generation: dict[str, Any] | None = None,
               card: str = "") -> Path:
    """Convert a CTranslate2 Transformer model directory into a Tolk model directory (written into out_dir).

    spms: the source and target SentencePiece models (default: found in src_dir, `find_spm`). Raises
    UnsupportedCheckpoint (a ValueError) naming what Tolk cannot compute, FileNotFoundError for a missing file.
    """
    src, out = Path(src_dir), Path(out_dir)
    if not (src / "model.bin").is_file():
        raise FileNotFoundError(f"{src}: model.bin is missing (not a CTranslate2 model directory)")
    source_spm, target_spm = spms or find_spm(src)
    for path in (source_spm, target_spm):
        if not path.is_file():
            raise FileNotFoundError(f"the SentencePiece model {path} is missing")
        try:
            spm.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError) as e:
            raise UnsupportedCheckpoint(f"{path} is not a SentencePiece model ({e})") from e
    spec, revision, raw = read_model_bin(src / "model.bin")
    check_supported(spec, revision, raw)
    v = Variables(dequantized(raw))
    config = read_json(src / "config.json")
    source, target = read_vocabularies(src)
    layers = tuple(1 + max((int(m.group(1)) for n in v.all if (m := re.match(rf"{s}/layer_(\d+)/", n))), default=-1)
                   for s in ("encoder", "decoder"))
    if not layers[0] or not layers[1]:
        raise UnsupportedCheckpoint("the model has no encoder or no decoder layers")
    d = v.take("decoder/embeddings/weight").shape[1]
    weights, fields = model_weights(v, (layers[0], layers[1]), d)
    fields.update(settings(v, weights, d, SPECS[spec]))
    rows, perm = positions(v, raw)
    if perm is not None:
        weights = permute_hidden(weights, perm)
    starts_from_zero = bool(v.flag("decoder", "start_from_zero_embedding", 0.0))
    left = [n for n in v.left if not IGNORED.search(n) and n.rsplit("/", 1)[-1] not in MUST_BE_OFF]
    if left:
        raise UnsupportedCheckpoint(f"model.bin holds variables Tolk has no place for: {sorted(left)[:5]}")
    if len(source) != weights["src_embed.weight"].shape[0] or len(target) != weights["tgt_embed.weight"].shape[0]:
        raise UnsupportedCheckpoint("the vocabularies' sizes differ from the embedding tables'")
    source, target, pad = with_pad(source, target, weights)
    ids = token_ids(config, target)
    if starts_from_zero:
        # A Marian model: its sources end with </s>, which CTranslate2's transformers converter leaves to
        # transformers' tokenizer to add (its Marian converter writes add_source_eos instead).
        source, target, start = zero_start(source, target, weights, pad)
        ids.update(decoder_start_id=start, add_source_eos=True)
    src_table, tgt_table = weights["src_embed.weight"], weights["tgt_embed.weight"]
    share = source == target and torch.equal(src_table, tgt_table)
    tie = torch.equal(weights["out_proj.weight"], tgt_table)
    cfg = ModelConfig(src_vocab_size=len(source), tgt_vocab_size=len(target), **fields,
                      encoder_layers=layers[0], decoder_layers=layers[1], share_embeddings=share, tie_output=tie,
                      output_bias="out_bias" in weights, max_positions=rows, pad_id=pad, **ids, dropout=0.0)
    model = Transformer(cfg)
    model.load_state_dict({k: weights[k] for k in model.state_dict()}, strict=True)
    own = source == spm_pieces(source_spm) and target == spm_pieces(target_spm)
    checkpoint.save(out, model, info, source_spm, target_spm, generation, None if own else target,
                    source_vocab=None if own or source == target else source)
    (out / "MODEL_CARD.md").write_text(f"# {info.name}\n\nImported by `tolk import` from a CTranslate2 model "
                                       f"({spec}, revision {revision}).\n\n{card}", encoding="utf-8")
    return out
