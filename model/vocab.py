"""SentencePiece vocabulary training and corpus encoding for model training."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import sentencepiece as spm

log = logging.getLogger(__name__)


def train_vocab(texts: list[Path], prefix: Path, vocab_size: int, sample_lines: int = 400_000) -> Path:
    """A shared unigram SentencePiece model over source and target text; ids pad 0, bos 1, eos 2, unk 3."""
    model = prefix.with_suffix(".model")
    if model.exists():
        log.info("vocabulary %s exists, reused", model)
        return model
    lines: list[str] = []
    for path in texts:
        lines.extend(path.read_text(encoding="utf-8").splitlines())
    random.Random(0).shuffle(lines)
    sample = prefix.with_suffix(".sample.txt")
    sample.write_text("\n".join(lines[:sample_lines]) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(sample), model_prefix=str(prefix), vocab_size=vocab_size, model_type="unigram",
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, byte_fallback=True, character_coverage=0.9999,
        input_sentence_size=sample_lines, shuffle_input_sentence=True, num_threads=2, minloglevel=1,
    )
    sample.unlink()
    return model


def encode_file(sp: spm.SentencePieceProcessor, path: Path, cache: Path) -> list[np.ndarray]:
    """Token ids of every line (end-of-sentence appended), cached next to the run as .npz."""
    if cache.exists():
        data = np.load(cache)
        return np.split(data["ids"], data["offsets"][1:-1])
    lines = path.read_text(encoding="utf-8").splitlines()
    encoded = sp.encode(lines, num_threads=2)
    arrays = [np.array(ids + [sp.eos_id()], dtype=np.int32) for ids in encoded]
    offsets = np.cumsum([0] + [len(a) for a in arrays])
    np.savez(cache, ids=np.concatenate(arrays), offsets=offsets)
    return arrays
