"""Import and export of Hugging Face Marian / OPUS-MT checkpoints, with exact parity to transformers.

A Hugging Face Marian directory holds config.json, model.safetensors (or pytorch_model.bin), source.spm,
target.spm, vocab.json (piece -> id, usually one table for both sides), tokenizer_config.json and
generation_config.json. None of this needs transformers: the files are read and written directly.

Ids: Marian numbers pieces its own way ("</s>" 0, "<unk>" 1, ..., "<pad>" last, and the decoder starts from pad),
so an imported model keeps vocab.json as a list (model id -> piece) and tokenizes through it. When the table holds
exactly the SentencePiece model's pieces, the import renumbers the weights to SentencePiece's ids and keeps no
list. The export moves pad to the last id, where Marian has it and CTranslate2's converter drops it; with the
import's renumbering, export then import gives back the same model directory.

Length limits: every Marian checkpoint sets forced_eos_token_id, so transformers forces end-of-sentence as the
last of max_length - 1 generated tokens. Tolk stops a hypothesis one token earlier and scores it as if that
end-of-sentence followed, which gives the same tokens and the same beam ranking: max_new_tokens = max_length - 2.

This module holds the import and the command-line entry points of both directions; the export is
`model.marian_export`, and what both read and name is `model.marian_format`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch
from safetensors.torch import load_file
from torch import Tensor

from model import checkpoint
from model.config import ModelConfig
from model.generation import MAX_NEW_TOKENS, GenerationConfig
from model.layers import sinusoidal_table
from model.marian_export import export_marian
from model.marian_format import UnsupportedCheckpoint, hf_layer_name, read_json
from model.transformer import Transformer

log = logging.getLogger(__name__)

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
# MarianConfig's defaults, used where config.json leaves a field out (as transformers does).
CONFIG_DEFAULTS: dict[str, Any] = {
    "vocab_size": 58101, "decoder_vocab_size": None, "max_position_embeddings": 1024, "encoder_layers": 12,
    "encoder_ffn_dim": 4096, "encoder_attention_heads": 16, "decoder_layers": 12, "decoder_ffn_dim": 4096,
    "decoder_attention_heads": 16, "activation_function": "gelu", "d_model": 1024, "dropout": 0.1,
    "attention_dropout": 0.0, "decoder_start_token_id": 58100, "scale_embedding": False, "pad_token_id": 58100,
    "eos_token_id": 0, "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True,
}
# Fields of old (BART-based) Marian configs that change the computation unless they hold these values.
CONFIG_REQUIRED: dict[str, Any] = {
    "normalize_embedding": False, "static_position_embeddings": True, "add_bias_logits": False,
    "is_encoder_decoder": True, "model_type": "marian",
}
# Generation fields Tolk has no counterpart for: refused unless they hold a neutral value.
GENERATION_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "early_stopping": (False, None), "forced_bos_token_id": (None,), "num_beam_groups": (None, 1),
    "diversity_penalty": (None, 0.0), "suppress_tokens": (None, []), "begin_suppress_tokens": (None, []),
    "sequence_bias": (None, {}), "guidance_scale": (None, 1.0), "exponential_decay_length_penalty": (None,),
    "encoder_repetition_penalty": (None, 1.0), "encoder_no_repeat_ngram_size": (None, 0), "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0), "eta_cutoff": (None, 0.0), "min_p": (None,), "top_h": (None,),
    "penalty_alpha": (None,), "force_words_ids": (None,), "constraints": (None,), "watermarking_config": (None,),
    "max_time": (None,),
}
# Read from config.json when there is no generation_config.json (old checkpoints), as transformers does.
GENERATION_KEYS = ("num_beams", "max_length", "max_new_tokens", "min_length", "min_new_tokens", "length_penalty",
                   "no_repeat_ngram_size", "repetition_penalty", "do_sample", "temperature", "top_k", "top_p",
                   "bad_words_ids", "forced_eos_token_id", "renormalize_logits", *GENERATION_NEUTRAL)


def load_weights(src: Path) -> dict[str, Tensor]:
    """All tensors of a Hugging Face checkpoint: safetensors (single or sharded), else a pickle-free .bin."""
    index = src / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(read_json(index)["weight_map"].values()))
        return {k: v for shard in shards for k, v in load_file(str(src / shard)).items()}
    if (src / "model.safetensors").is_file():
        return load_file(str(src / "model.safetensors"))
    if (src / "pytorch_model.bin").is_file():
        return dict(torch.load(src / "pytorch_model.bin", map_location="cpu", weights_only=True))
    raise FileNotFoundError(f"{src}: no model.safetensors or pytorch_model.bin")


def model_config(hf: dict[str, Any], generation: dict[str, Any], weights: dict[str, Tensor]) -> ModelConfig:
    """Map a Marian config.json onto ModelConfig, refusing what would compute something else."""
    c = {**CONFIG_DEFAULTS, **{k: v for k, v in hf.items() if k in CONFIG_DEFAULTS and v is not None}}
    for field, value in CONFIG_REQUIRED.items():
        if hf.get(field, value) != value:
            raise UnsupportedCheckpoint(f"config.json {field}={hf[field]!r} is not supported (need {value!r})")
    for ours, theirs in (("encoder_attention_heads", "decoder_attention_heads"),
                         ("encoder_ffn_dim", "decoder_ffn_dim")):
        if c[ours] != c[theirs]:
            raise UnsupportedCheckpoint(f"config.json {theirs} must equal {ours}, got {c[theirs]} != {c[ours]}")
    if c["activation_function"] not in ACTIVATIONS:
        raise UnsupportedCheckpoint(f"config.json activation_function={c['activation_function']!r} is not "
                                    f"supported (one of {sorted(ACTIVATIONS)})")
    eos = c["eos_token_id"]
    if isinstance(eos, list):
        if len(eos) != 1:
            raise UnsupportedCheckpoint(f"config.json eos_token_id={eos}: only one end-of-sentence id is supported")
        eos = eos[0]
    norm = "pre" if hf.get("normalize_before", False) else "post"
    if norm == "pre" and not (hf.get("add_final_layer_norm") and "model.encoder.layer_norm.weight" in weights):
        raise UnsupportedCheckpoint("config.json normalize_before=true needs add_final_layer_norm=true and the "
                                    "final layer norms in the weights")
    if norm == "post" and hf.get("add_final_layer_norm", False):
        raise UnsupportedCheckpoint("config.json add_final_layer_norm=true is supported only with normalize_before")
    share, tie = bool(c["share_encoder_decoder_embeddings"]), bool(c["tie_word_embeddings"])
    src_vocab, tgt_vocab = int(c["vocab_size"]), int(c["decoder_vocab_size"] or c["vocab_size"])
    if share and tgt_vocab != src_vocab:
        raise UnsupportedCheckpoint(f"config.json decoder_vocab_size={tgt_vocab} with shared embeddings")
    src, tgt, out = embedding_tables(share, tie, weights)
    return ModelConfig(
        src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab,
        d_model=int(c["d_model"]), n_heads=int(c["encoder_attention_heads"]),
        encoder_layers=int(c["encoder_layers"]), decoder_layers=int(c["decoder_layers"]),
        d_ff=int(c["encoder_ffn_dim"]), activation=ACTIVATIONS[c["activation_function"]], norm=norm,
        scale_embedding=bool(c["scale_embedding"]), share_embeddings=src is tgt or torch.equal(src, tgt),
        tie_output=out is tgt or torch.equal(out, tgt), output_bias=True,
        max_positions=int(c["max_position_embeddings"]), pad_id=int(c["pad_token_id"]),
        bos_id=banned_bos(hf, generation, eos), eos_id=int(eos), unk_id=0,  # unk_id is set from vocab.json
        decoder_start_id=int(c["decoder_start_token_id"]), dropout=float(c["dropout"]),
        attention_dropout=float(c["attention_dropout"]),
    )


def embedding_tables(share: bool, tie: bool, weights: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """Source, target and output tables as transformers 5 ties them: with tie_word_embeddings false it ties
    nothing, so even a "shared" checkpoint then uses the encoder's and decoder's own tables."""
    shared = "model.shared.weight"
    enc, dec = "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"
    if share and tie:
        src = tgt = pick(weights, shared, enc, dec)
    elif share:
        src, tgt = pick(weights, enc, shared), pick(weights, dec, shared)
    else:
        src, tgt = pick(weights, enc), pick(weights, dec)
    return src, tgt, tgt if tie else pick(weights, "lm_head.weight")


def pick(weights: dict[str, Tensor], *names: str) -> Tensor:
    for name in names:
        if name in weights:
            return weights[name]
    raise UnsupportedCheckpoint(f"the weights have none of {list(names)}")


def banned_bos(hf: dict[str, Any], generation: dict[str, Any], eos: int) -> int:
    """A bos id distinct from eos and never generated becomes ModelConfig.bos_id; Marian's (= eos) is none."""
    bos = generation.get("bos_token_id", hf.get("bos_token_id"))
    banned = {ids[0] for ids in generation.get("bad_words_ids") or [] if len(ids) == 1}
    return int(bos) if isinstance(bos, int) and bos != eos and bos in banned else -1


def state_dict(cfg: ModelConfig, share: bool, tie: bool, weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """Tolk parameter name -> tensor, taken from a Hugging Face Marian state dict."""
    src, tgt, proj = embedding_tables(share, tie, weights)
    out: dict[str, Tensor] = {"src_embed.weight": src, "tgt_embed.weight": tgt, "out_proj.weight": proj}
    bias = weights.get("final_logits_bias", torch.zeros(1, cfg.tgt_vocab_size))  # absent means zeros
    out["out_bias"] = bias.reshape(-1)
    used = {"model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
            "lm_head.weight", "final_logits_bias"}
    for name in Transformer(cfg).state_dict():
        theirs = hf_layer_name(name)
        if theirs is None and name.startswith(("encoder_norm.", "decoder_norm.")):
            theirs = f"model.{name.split('_')[0]}.layer_norm.{name.split('.')[-1]}"
        if theirs is not None:
            out[name] = pick(weights, theirs)
            used.add(theirs)
    for stack in ("encoder", "decoder"):
        name = f"model.{stack}.embed_positions.weight"
        if name in weights:
            check_positions(name, weights[name], cfg)
            used.add(name)
    unknown = sorted(set(weights) - used)
    if unknown:
        raise UnsupportedCheckpoint(f"the weights hold tensors Tolk has no place for: {unknown[:5]}")
    return {k: v.float() for k, v in out.items()}


def check_positions(name: str, table: Tensor, cfg: ModelConfig) -> None:
    ours = sinusoidal_table(table.shape[0], cfg.d_model)
    if table.shape != ours.shape or not torch.allclose(table.float(), ours, atol=1e-4):
        raise UnsupportedCheckpoint(f"{name} is not the static sinusoidal table (learned positions?)")


def read_vocab(path: Path, size: int) -> list[str]:
    """vocab.json (piece -> id) as a list of pieces by id; every id below size must have exactly one piece."""
    table = read_json(path)
    if not table:
        raise FileNotFoundError(f"{path} is missing")
    pieces = [""] * size
    for piece, i in table.items():
        if not 0 <= i < size or pieces[i]:
            raise UnsupportedCheckpoint(f"{path.name}: id {i} of {piece!r} is out of range or given twice")
        pieces[i] = piece
    holes = [i for i, p in enumerate(pieces) if not p]
    if holes:
        raise UnsupportedCheckpoint(f"{path.name} has no piece for ids {holes[:5]} (vocabulary size {size})")
    return pieces


def spm_numbering(pieces: list[str], path: Path) -> list[int] | None:
    """SentencePiece's id of each model id, when the table holds exactly the SentencePiece model's pieces."""
    sp = spm.SentencePieceProcessor(model_file=str(path))
    ids = [sp.piece_to_id(p) for p in pieces]
    return ids if sorted(ids) == list(range(sp.get_piece_size())) else None


ID_FIELDS = ("pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id", "forced_eos_token_id")


def renumber(hf: dict[str, Any], generation: dict[str, Any], weights: dict[str, Tensor], src: list[int],
             tgt: list[int]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Tensor]]:
    """Move every vocabulary-indexed tensor and id of a checkpoint to new ids: row i goes to row src[i] / tgt[i]."""
    share = {**CONFIG_DEFAULTS, **hf}["share_encoder_decoder_embeddings"]
    pad = {**CONFIG_DEFAULTS, **hf}["pad_token_id"]
    if (share and src != tgt) or src[pad] != tgt[pad]:
        raise UnsupportedCheckpoint("source and target vocabularies number pad or shared pieces differently")
    perm = {"model.shared.weight": src, "model.encoder.embed_tokens.weight": src,
            "model.decoder.embed_tokens.weight": tgt, "lm_head.weight": tgt, "final_logits_bias": tgt}

    def move(name: str, t: Tensor) -> Tensor:
        dim = 1 if name == "final_logits_bias" else 0
        return torch.empty_like(t).index_copy_(dim, torch.tensor(perm[name]), t)

    def ids(d: dict[str, Any]) -> dict[str, Any]:
        out = {k: [tgt[i] for i in v] if isinstance(v, list) else tgt[v]
               for k, v in d.items() if k in ID_FIELDS and v is not None}
        if d.get("bad_words_ids"):
            out["bad_words_ids"] = [[tgt[i] for i in seq] for seq in d["bad_words_ids"]]
        return {**d, **out}

    return ids(hf), ids(generation), {k: move(k, v) if k in perm else v for k, v in weights.items()}


def generation_defaults(generation: dict[str, Any], cfg: ModelConfig) -> dict[str, Any]:
    """Map generation_config.json onto GenerationConfig fields; refuse settings Tolk cannot reproduce."""
    for field, neutral in GENERATION_NEUTRAL.items():
        if generation.get(field) not in neutral:
            raise UnsupportedCheckpoint(f"generation setting {field}={generation[field]!r} is not supported")
    forced = generation.get("forced_eos_token_id")
    if forced not in (None, cfg.eos_id, [cfg.eos_id]):
        raise UnsupportedCheckpoint(f"forced_eos_token_id={forced!r} differs from eos_token_id={cfg.eos_id}")
    banned = {cfg.pad_id, cfg.decoder_start_id, cfg.bos_id} - {cfg.eos_id, -1}
    bad = [ids for ids in generation.get("bad_words_ids") or [] if len(ids) != 1 or ids[0] not in banned]
    if bad:
        raise UnsupportedCheckpoint(f"bad_words_ids {bad} are not supported (only pad/decoder start/bos)")
    if generation.get("bad_words_ids") and generation.get("renormalize_logits") is not True:
        log.warning("renormalize_logits is not set: transformers' beam scores keep the banned tokens' probability "
                    "mass, Tolk renormalises (outputs may differ in rare near-ties)")
    out: dict[str, Any] = {}
    spare = 1 if forced is not None else 0  # the forced end-of-sentence is not generated by Tolk
    if generation.get("max_new_tokens") is not None:
        out["max_new_tokens"] = int(generation["max_new_tokens"]) - spare
    elif generation.get("max_length") is not None:
        out["max_new_tokens"] = int(generation["max_length"]) - 1 - spare
    if "max_new_tokens" in out:
        out["max_new_tokens"] = max(1, min(out["max_new_tokens"], MAX_NEW_TOKENS, cfg.max_positions - 1))
    if generation.get("min_new_tokens") is not None:
        out["min_new_tokens"] = int(generation["min_new_tokens"])
    elif generation.get("min_length"):
        out["min_new_tokens"] = max(0, int(generation["min_length"]) - 1)  # min_length counts the start token
    simple = {"num_beams": "beam_size", "length_penalty": "length_penalty", "do_sample": "do_sample",
              "no_repeat_ngram_size": "no_repeat_ngram_size", "repetition_penalty": "repetition_penalty",
              "temperature": "temperature", "top_p": "top_p"}
    out.update({ours: generation[theirs] for theirs, ours in simple.items() if generation.get(theirs) is not None})
    if generation.get("do_sample"):
        out["top_k"] = int(generation.get("top_k", 50) or 0)  # transformers samples among 50 unless told
    defaults = GenerationConfig().to_dict()
    GenerationConfig().update(**out)  # raises ValueError naming a field out of range
    return {k: v for k, v in out.items() if v != defaults[k]}


def languages(src: Path, tok: dict[str, Any], name: str | None = None) -> tuple[str, str]:
    """Languages from tokenizer_config.json, else from an opus-mt-SRC-TGT name (default: the directory's)."""
    parts = (name or src.resolve().name).split("-")
    guess = (parts[-2], parts[-1]) if len(parts) >= 3 else ("und", "und")
    return str(tok.get("source_lang") or guess[0]), str(tok.get("target_lang") or guess[1])


def import_marian(src_dir: Path | str, out_dir: Path | str, name: str | None = None,
                  source_language: str | None = None, target_language: str | None = None) -> Path:
    """Convert a Hugging Face Marian checkpoint directory into a Tolk model directory."""
    src, out = Path(src_dir), Path(out_dir)
    hf = read_json(src / "config.json")
    if not hf:
        raise FileNotFoundError(f"{src}: config.json is missing")
    generation = read_json(src / "generation_config.json") or {k: hf[k] for k in GENERATION_KEYS if k in hf}
    tok = read_json(src / "tokenizer_config.json")
    weights = load_weights(src)
    sizes = {**CONFIG_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    spms = [src / "source.spm", src / "target.spm"]
    pieces = read_vocab(src / "vocab.json", int(sizes["vocab_size"]))
    target = pieces
    if tok.get("separate_vocabs"):
        target = read_vocab(src / "target_vocab.json", int(sizes["decoder_vocab_size"] or sizes["vocab_size"]))
    unk = tok.get("unk_token", "<unk>")
    if unk not in target:
        raise UnsupportedCheckpoint(f"the vocabulary has no unknown piece {unk!r}")
    unk_id = target.index(unk)
    vocab: list[str] | None = pieces
    perms = spm_numbering(pieces, spms[0]), spm_numbering(target, spms[1])
    if perms[0] is not None and perms[1] is not None:  # the tables hold exactly the SentencePiece pieces
        hf, generation, weights = renumber(hf, generation, weights, perms[0], perms[1])
        vocab, unk_id = None, perms[1][unk_id]
    elif target is not pieces:
        raise UnsupportedCheckpoint("tokenizer_config.json separate_vocabs=true is supported only when the tables "
                                    "hold exactly the SentencePiece models' pieces")
    cfg = ModelConfig.from_dict({**model_config(hf, generation, weights).to_dict(), "unk_id": unk_id})
    model = Transformer(cfg)
    flags = {**CONFIG_DEFAULTS, **hf}
    share, tie = bool(flags["share_encoder_decoder_embeddings"]), bool(flags["tie_word_embeddings"])
    model.load_state_dict(state_dict(cfg, share, tie, weights), strict=True)
    src_lang, tgt_lang = languages(src, tok)
    info = checkpoint.ModelInfo(name or src.resolve().name, source_language or src_lang,
                                target_language or tgt_lang)
    for stale in ("vocab.json", "generation.json"):  # a forced import over an older one must not keep them
        (out / stale).unlink(missing_ok=True)
    checkpoint.save(out, model, info, spms[0], spms[1], generation_defaults(generation, cfg), vocab)
    card = (src / "README.md").read_text(encoding="utf-8") if (src / "README.md").is_file() else ""
    (out / "MODEL_CARD.md").write_text(f"# {info.name}\n\nImported by `tolk import-marian` from a Hugging Face "
                                       f"Marian checkpoint. The original model card follows.\n\n{card}")
    return out


def check_output(out: Path, force: bool) -> None:
    if out.exists() and any(out.iterdir()) and not force:
        raise FileExistsError(f"{out} exists and is not empty (use --force to write into it)")


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", type=Path, help="Tolk model directory")
    p.add_argument("out_dir", type=Path, help="Hugging Face Marian checkpoint directory to write")
    p.add_argument("--force", action="store_true", help="write into a non-empty output directory")


def export_main(args: argparse.Namespace) -> int:
    try:
        check_output(args.out_dir, args.force)
        out = export_marian(args.model_dir, args.out_dir)
    except (ValueError, OSError) as e:
        print(f"tolk export-marian: error: {e}", file=sys.stderr)
        return 1
    print(f"exported {args.model_dir} -> {out}")
    return 0
