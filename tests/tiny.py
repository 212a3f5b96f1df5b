"""Tiny models for tests: SentencePiece trained on generated text, a 2+2-layer Transformer of width 32."""

from __future__ import annotations

import random
from pathlib import Path

import sentencepiece as spm
import torch

from model.checkpoint import ModelInfo, save
from model.config import ModelConfig
from model.transformer import Transformer

WORDS = """the file could not be opened save changes before closing open settings window click here to continue
error while reading disk full select all copy paste undo translation server language model
ação não configurações arquivo salvar""".split()


def corpus_lines(n: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12))).capitalize() + "." for _ in range(n)]


def train_spm(directory: Path, vocab_size: int = 320) -> Path:
    """Train a small SentencePiece model with the Tolk special ids: pad 0, bos 1, eos 2, unk 3."""
    directory.mkdir(parents=True, exist_ok=True)
    text = directory / "spm_train.txt"
    text.write_text("\n".join(corpus_lines()) + "\n")
    prefix = directory / "tiny"
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(prefix), vocab_size=vocab_size, model_type="unigram",
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, byte_fallback=True, character_coverage=1.0,
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


def tiny_config(vocab_size: int = 96, **changes: object) -> ModelConfig:
    base: dict[str, object] = dict(
        src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, d_model=32, n_heads=4, encoder_layers=2,
        decoder_layers=2, d_ff=64, dropout=0.0, max_positions=128,
    )
    base.update(changes)
    return ModelConfig(**base)  # type: ignore[arg-type]


def tiny_model(cfg: ModelConfig | None = None, seed: int = 0) -> Transformer:
    """A random model whose outputs vary with the input (larger weights than training init gives)."""
    torch.manual_seed(seed)
    model = Transformer(cfg or tiny_config())
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.5 if p.dim() > 1 else 0.1)
            if "embed" in name:
                p[model.cfg.pad_id].zero_()
    return model.eval()


def train_copy(model: Transformer, sp: spm.SentencePieceProcessor, steps: int = 150) -> Transformer:
    """A few seconds of training to copy the source: outputs then vary with the input and end with eos."""
    cfg = model.cfg
    lines = [sp.encode(s) for s in corpus_lines(256, seed=1)]
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        chunk = lines[(step * 16) % 256:][:16]
        T = max(len(x) for x in chunk) + 1
        src = torch.full((len(chunk), T), cfg.pad_id)
        tgt = torch.full((len(chunk), T + 1), cfg.pad_id)
        for i, ids in enumerate(chunk):
            src[i, : len(ids) + 1] = torch.tensor(ids + [cfg.eos_id])
            tgt[i, : len(ids) + 2] = torch.tensor([cfg.decoder_start_id] + ids + [cfg.eos_id])
        logits = model(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tgt[:, 1:], ignore_index=cfg.pad_id)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def make_model_dir(directory: Path, seed: int = 0) -> Path:
    """A complete model directory (en -> pt) with a shared tiny SentencePiece model."""
    spm_path = train_spm(directory / "spm")
    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    torch.manual_seed(seed)
    model = train_copy(Transformer(tiny_config(vocab_size=sp.get_piece_size())), sp)
    save(directory, model, ModelInfo("tiny-en-pt", "en", "pt"), spm_path, spm_path,
         generation={"max_new_tokens": 24})
    (directory / "MODEL_CARD.md").write_text("# tiny test model\nRandom weights, for tests only.\n")
    return directory
