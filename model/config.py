"""The frozen model configuration, saved as config.json next to the weights."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

ACTIVATIONS = ("relu", "gelu", "swish")
NORMS = ("post", "pre")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of an encoder-decoder Transformer; expresses the Marian / OPUS-MT family exactly."""

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    n_heads: int = 8
    encoder_layers: int = 6
    decoder_layers: int = 6
    d_ff: int = 2048
    activation: str = "swish"  # relu | gelu (exact, erf) | swish (SiLU)
    norm: str = "post"  # post: LayerNorm after each residual (the paper, Marian); pre: before, plus a final one
    scale_embedding: bool = True  # multiply token embeddings by sqrt(d_model)
    share_embeddings: bool = True  # one embedding table for source and target (needs equal vocabularies)
    tie_output: bool = True  # the output projection reuses the target embedding table
    output_bias: bool = True  # a bias on the logits (Marian's final_logits_bias)
    max_positions: int = 512
    pad_id: int = 0
    bos_id: int = 1  # -1 when the vocabulary has none (Marian)
    eos_id: int = 2
    unk_id: int = 3
    decoder_start_id: int = 1  # first decoder input; Marian uses pad
    add_source_bos: bool = False  # bos_id in front of every source (CTranslate2's add_source_bos)
    add_source_eos: bool = True  # eos_id after every source; OpenNMT-py (Argos) models are trained without it
    layer_norm_eps: float = 1e-5
    dropout: float = 0.1
    attention_dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.d_model % 2:
            raise ValueError("d_model must be even for sinusoidal positions")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError("share_embeddings needs src_vocab_size == tgt_vocab_size")
        if self.add_source_bos and not 0 <= self.bos_id < self.src_vocab_size:
            raise ValueError("add_source_bos needs a bos_id in the source vocabulary")
        for name in ("pad_id", "eos_id", "unk_id", "decoder_start_id"):
            if not 0 <= getattr(self, name) < self.tgt_vocab_size:
                raise ValueError(f"{name} must be a valid target token id")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown model config fields: {sorted(unknown)}")
        return cls(**data)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> ModelConfig:
        return cls.from_dict(json.loads(path.read_text()))
