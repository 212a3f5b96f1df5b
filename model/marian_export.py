"""Export of a Tolk model directory as a Hugging Face Marian checkpoint (MarianMTModel + MarianTokenizer).

Ids and length limits are those `model.marian` describes: pad moves to the last id, where Marian has it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from model import checkpoint
from model.config import ModelConfig
from model.generation import GenerationConfig
from model.marian_format import UnsupportedCheckpoint, hf_layer_name, spm_pieces
from model.transformer import Transformer


def hf_weights(model: Transformer) -> dict[str, Tensor]:
    """The Hugging Face Marian state dict of a (post-norm) Tolk model; tied tables are written once."""
    cfg = model.cfg
    sd = model.state_dict()
    out: dict[str, Tensor] = {}
    if cfg.share_embeddings:
        out["model.shared.weight"] = sd["src_embed.weight"]
    if not cfg.share_embeddings or not cfg.tie_output:  # transformers 5 ties nothing without tie_word_embeddings
        out["model.encoder.embed_tokens.weight"] = sd["src_embed.weight"]
        out["model.decoder.embed_tokens.weight"] = sd["tgt_embed.weight"]
    if not cfg.tie_output:
        out["lm_head.weight"] = sd["out_proj.weight"]
    bias = sd["out_bias"] if cfg.output_bias else torch.zeros(cfg.tgt_vocab_size)
    out["final_logits_bias"] = bias.reshape(1, -1)
    for name, tensor in sd.items():
        theirs = hf_layer_name(name)
        if theirs is not None:
            out[theirs] = tensor
    return {k: v.detach().float().cpu().contiguous().clone() for k, v in out.items()}


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    if cfg.norm != "post" or cfg.layer_norm_eps != 1e-5:
        raise UnsupportedCheckpoint("transformers' MarianMTModel is post-norm with LayerNorm eps 1e-5; this model "
                                    f"has norm={cfg.norm!r}, layer_norm_eps={cfg.layer_norm_eps}")
    return {
        "architectures": ["MarianMTModel"], "model_type": "marian", "is_encoder_decoder": True,
        "vocab_size": cfg.src_vocab_size, "decoder_vocab_size": cfg.tgt_vocab_size, "d_model": cfg.d_model,
        "encoder_layers": cfg.encoder_layers, "decoder_layers": cfg.decoder_layers,
        "encoder_attention_heads": cfg.n_heads, "decoder_attention_heads": cfg.n_heads,
        "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff, "activation_function": cfg.activation,
        "max_position_embeddings": cfg.max_positions, "scale_embedding": cfg.scale_embedding,
        "share_encoder_decoder_embeddings": cfg.share_embeddings, "tie_word_embeddings": cfg.tie_output,
        "pad_token_id": cfg.pad_id, "eos_token_id": cfg.eos_id, "bos_token_id": cfg.bos_id if cfg.bos_id >= 0 else None,
        "decoder_start_token_id": cfg.decoder_start_id, "forced_eos_token_id": cfg.eos_id,
        "dropout": cfg.dropout, "attention_dropout": cfg.attention_dropout, "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "use_cache": True,
    }


def hf_generation(cfg: ModelConfig, gen: GenerationConfig) -> dict[str, Any]:
    """generation_config.json under which transformers' generate() reproduces Tolk's decoding."""
    banned = sorted({cfg.pad_id, cfg.decoder_start_id, cfg.bos_id} - {cfg.eos_id, -1})
    out: dict[str, Any] = {
        "bad_words_ids": [[i] for i in banned], "decoder_start_token_id": cfg.decoder_start_id,
        "eos_token_id": cfg.eos_id, "forced_eos_token_id": cfg.eos_id, "pad_token_id": cfg.pad_id,
        # + the start token and the forced end-of-sentence, which must still find a position
        "max_length": min(gen.max_new_tokens, cfg.max_positions - 1) + 2, "num_beams": gen.beam_size,
        "renormalize_logits": True,
    }
    if cfg.bos_id >= 0:
        out["bos_token_id"] = cfg.bos_id
    if gen.length_penalty != 1.0:
        out["length_penalty"] = gen.length_penalty
    if gen.min_new_tokens:
        out["min_length"] = gen.min_new_tokens + 1
    if gen.no_repeat_ngram_size:
        out["no_repeat_ngram_size"] = gen.no_repeat_ngram_size
    if gen.repetition_penalty != 1.0:
        out["repetition_penalty"] = gen.repetition_penalty
    if gen.do_sample:
        out.update(do_sample=True, temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p)
    return out


def pad_last(model: Transformer, source: list[str], target: list[str]) -> tuple[Transformer, list[str], list[str]]:
    """Renumber pad to the last id, where Marian puts it and CTranslate2's converter drops it (pad 0 becomes
    V-1, every other id moves down by one); a model that already has it last is returned as it is."""
    cfg, sd = model.cfg, model.state_dict()
    V = cfg.tgt_vocab_size
    if cfg.pad_id == V - 1 or cfg.src_vocab_size != V:  # one pad id cannot be last in tables of two sizes
        return model, source, target
    order = [i for i in range(V) if i != cfg.pad_id] + [cfg.pad_id]
    new_id = {old: new for new, old in enumerate(order)}
    ids = {f: new_id[getattr(cfg, f)] for f in ("pad_id", "eos_id", "unk_id", "decoder_start_id")}
    renumbered = Transformer(ModelConfig.from_dict({**cfg.to_dict(), **ids, "bos_id": new_id.get(cfg.bos_id, -1)}))
    for name in ("src_embed.weight", "tgt_embed.weight", "out_proj.weight", "out_bias"):
        if name in sd:
            sd[name] = sd[name][order]
    renumbered.load_state_dict(sd)
    return renumbered.eval(), [source[i] for i in order], [target[i] for i in order]



def export_marian(model_dir: Path | str, out_dir: Path | str) -> Path:
    """Write a Tolk model directory as a Hugging Face Marian checkpoint (MarianMTModel + MarianTokenizer)."""
    src, out = Path(model_dir), Path(out_dir)
    loaded = checkpoint.load(src, device="cpu")
    source = loaded.tokenizer.vocab or spm_pieces(src / "source.spm")
    target = loaded.tokenizer.vocab or spm_pieces(src / "target.spm")
    cfg = loaded.model.cfg
    if (len(source), len(target)) != (cfg.src_vocab_size, cfg.tgt_vocab_size):
        raise UnsupportedCheckpoint(f"the vocabularies have {len(source)} and {len(target)} pieces, the model "
                                    f"{cfg.src_vocab_size} and {cfg.tgt_vocab_size} ids")
    model, source, target = pad_last(loaded.model, source, target)
    cfg = model.cfg
    config = hf_config(cfg)
    out.mkdir(parents=True, exist_ok=True)
    save_file(hf_weights(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    separate = source != target
    files = {
        "config.json": config,
        "generation_config.json": hf_generation(cfg, loaded.generation),
        "vocab.json": {p: i for i, p in enumerate(source)},
        "tokenizer_config.json": {
            "tokenizer_class": "MarianTokenizer", "source_lang": loaded.info.source_language,
            "target_lang": loaded.info.target_language, "unk_token": target[cfg.unk_id],
            "eos_token": target[cfg.eos_id], "pad_token": target[cfg.pad_id], "model_max_length": cfg.max_positions,
            "separate_vocabs": separate, "sp_model_kwargs": {},
        },
    }
    if separate:
        files["target_vocab.json"] = {p: i for i, p in enumerate(target)}
    for name, data in files.items():
        (out / name).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    for name in ("source.spm", "target.spm"):
        shutil.copyfile(src / name, out / name)
    if (src / "MODEL_CARD.md").is_file():
        shutil.copyfile(src / "MODEL_CARD.md", out / "README.md")
    return out
