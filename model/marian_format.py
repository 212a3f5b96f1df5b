"""The Hugging Face Marian checkpoint format as both directions see it: parameter names, JSON files, the error.

`model.marian` imports such checkpoints, `model.marian_export` writes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import sentencepiece as spm

LAYER_NAMES = {  # Tolk sublayer -> Hugging Face sublayer
    "self_attn": "self_attn", "self_res.norm": "self_attn_layer_norm", "cross_attn": "encoder_attn",
    "cross_res.norm": "encoder_attn_layer_norm", "ff.fc1": "fc1", "ff.fc2": "fc2", "ff_res.norm": "final_layer_norm",
}


class UnsupportedCheckpoint(ValueError):
    """A checkpoint (or model) uses something the other side cannot express; the message names the field."""


def hf_layer_name(name: str) -> str | None:
    """encoder.0.self_res.norm.weight -> model.encoder.layers.0.self_attn_layer_norm.weight (None if not a layer)."""
    stack, index, rest = (name.split(".", 2) + ["", ""])[:3]
    if stack not in ("encoder", "decoder") or not index.isdigit():
        return None
    for ours, theirs in LAYER_NAMES.items():
        if rest.startswith(ours + "."):
            return f"model.{stack}.layers.{index}.{theirs}{rest[len(ours):]}"
    raise KeyError(name)


def read_json(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else {}


def spm_pieces(path: Path) -> list[str]:
    sp = spm.SentencePieceProcessor(model_file=str(path))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
