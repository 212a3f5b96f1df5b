"""CTranslate2 conversion of a Tolk model directory, read directly (pre-norm models included).

`tolk export-marian` then CTranslate2's TransformersConverter covers post-norm models only, because transformers'
Marian has no pre-norm variant (Tolk's shipped en-pt model is pre-norm). This converter builds CTranslate2's
TransformerSpec from the Tolk weights and ids as they are, so the converted model decodes from Tolk's own
decoder start token (no zero-embedding convention, no pad renumbering). Translate with
`suppress_sequences=[[piece] for piece in banned_pieces(model_dir)]` to forbid what Tolk forbids.

    python bench/ct2_convert.py weights/en-pt /tmp/en-pt-ct2 [--quantization int8]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import cast

import torch
from ctranslate2.converters.converter import Converter
from ctranslate2.specs import common_spec, transformer_spec
from torch import Tensor

from model import checkpoint
from model.layers import Attention, DecoderLayer, EncoderLayer, FeedForward, Residual, embed_scale
from model.marian_format import spm_pieces

ACTIVATIONS = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU,
               "swish": common_spec.Activation.SWISH}


def banned_pieces(model_dir: Path) -> list[str]:
    """Pieces Tolk never generates (pad, decoder start, bos), as CTranslate2's suppress_sequences want them."""
    loaded = checkpoint.load(model_dir, device="cpu")
    cfg = loaded.model.cfg
    pieces = loaded.tokenizer.vocab or spm_pieces(model_dir / "target.spm")
    return [pieces[i] for i in sorted({cfg.pad_id, cfg.decoder_start_id, cfg.bos_id} - {cfg.eos_id, -1})]


def set_linear(spec: common_spec.LinearSpec, *layers: torch.nn.Linear) -> None:
    """One CTranslate2 linear from one or more (fused along the output) torch linears."""
    spec.weight = torch.cat([layer.weight.detach() for layer in layers])
    spec.bias = torch.cat([layer.bias.detach() for layer in layers])


def set_norm(spec: common_spec.LayerNormSpec, norm: torch.nn.Module) -> None:
    ln = cast(torch.nn.LayerNorm, norm)
    spec.gamma, spec.beta = ln.weight.detach(), ln.bias.detach()


def set_self_attention(spec: transformer_spec.attention_spec.MultiHeadAttentionSpec, attn: Attention,
                       res: Residual) -> None:
    set_linear(spec.linear[0], attn.q_proj, attn.k_proj, attn.v_proj)
    set_linear(spec.linear[1], attn.out_proj)
    set_norm(spec.layer_norm, res.norm)


def set_ffn(spec: transformer_spec.FeedForwardSpec, ff: FeedForward, res: Residual) -> None:
    set_linear(spec.linear_0, ff.fc1)
    set_linear(spec.linear_1, ff.fc2)
    set_norm(spec.layer_norm, res.norm)


def set_embeddings(spec: transformer_spec.TransformerEncoderSpec | transformer_spec.TransformerDecoderSpec,
                   table: Tensor, positions: Tensor, scale: float) -> None:
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = table.detach()
    spec.position_encodings.encodings = positions  # Tolk's (Marian's) sinusoid, not CTranslate2's own
    spec.scale_embeddings = scale


class TolkConverter(Converter):
    """Converts a Tolk model directory: TolkConverter(dir).convert(out_dir, quantization=None or "int8")."""

    def __init__(self, model_dir: Path | str) -> None:
        self.model_dir = Path(model_dir)

    def _load(self) -> transformer_spec.TransformerSpec:
        loaded = checkpoint.load(self.model_dir, device="cpu")
        model, cfg = loaded.model, loaded.model.cfg
        pre = cfg.norm == "pre"
        spec = transformer_spec.TransformerSpec.from_config(
            (cfg.encoder_layers, cfg.decoder_layers), cfg.n_heads, pre_norm=pre, activation=ACTIVATIONS[cfg.activation])
        scale = embed_scale(cfg)
        set_embeddings(spec.encoder, model.src_embed.weight, model.positions, scale)
        set_embeddings(spec.decoder, model.tgt_embed.weight, model.positions, scale)
        for layer_spec, encoder_layer in zip(spec.encoder.layer, model.encoder, strict=True):
            layer = cast(EncoderLayer, encoder_layer)
            set_self_attention(layer_spec.self_attention, layer.self_attn, layer.self_res)
            set_ffn(layer_spec.ffn, layer.ff, layer.ff_res)
        for layer_spec, decoder_layer in zip(spec.decoder.layer, model.decoder, strict=True):
            dec = cast(DecoderLayer, decoder_layer)
            set_self_attention(layer_spec.self_attention, dec.self_attn, dec.self_res)
            set_linear(layer_spec.attention.linear[0], dec.cross_attn.q_proj)
            set_linear(layer_spec.attention.linear[1], dec.cross_attn.k_proj, dec.cross_attn.v_proj)
            set_linear(layer_spec.attention.linear[2], dec.cross_attn.out_proj)
            set_norm(layer_spec.attention.layer_norm, dec.cross_res.norm)
            set_ffn(layer_spec.ffn, dec.ff, dec.ff_res)
        if pre:
            set_norm(spec.encoder.layer_norm, model.encoder_norm)
            set_norm(spec.decoder.layer_norm, model.decoder_norm)
        spec.decoder.projection.weight = model.out_proj.weight.detach()
        if model.out_bias is not None:
            spec.decoder.projection.bias = model.out_bias.detach()
        source = loaded.tokenizer.vocab or spm_pieces(self.model_dir / "source.spm")
        target = loaded.tokenizer.vocab or spm_pieces(self.model_dir / "target.spm")
        spec.register_source_vocabulary(source)
        spec.register_target_vocabulary(target)
        spec.config.unk_token, spec.config.eos_token = target[cfg.unk_id], target[cfg.eos_id]
        spec.config.bos_token = target[cfg.bos_id] if cfg.bos_id >= 0 else target[cfg.eos_id]
        spec.config.decoder_start_token = target[cfg.decoder_start_id]
        spec.config.layer_norm_epsilon = cfg.layer_norm_eps
        return spec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--quantization", default=None, help="e.g. int8 (default: keep float32)")
    args = p.parse_args()
    print(TolkConverter(args.model_dir).convert(str(args.out_dir), quantization=args.quantization, force=True))


if __name__ == "__main__":
    main()
