"""A model's source vocabulary extended with whole words of the source language (`tolk extend-source-vocab`).

The shipped models share one SentencePiece vocabulary of 8,000 pieces between English and Portuguese, learnt
mostly from software text. Everyday Portuguese words fall apart into pieces that mean something else: "paisagem" is
"pai" + "s" + "agem", and pt-en writes "parentscape"; "praia" is "pra" + "ia", and it writes "pleasure".

This writes a copy of a model directory whose source side has a vocabulary of its own: the old pieces with their
ids and embeddings, then the pieces of a unigram model trained on source-language text that the old vocabulary
lacks, each embedded as the mean of the embeddings of the old pieces it used to be cut into. The new pieces' scores
are the new model's, moved by the mean difference between the two models' scores of the pieces both have, so that
the two sets compete on one scale. The target side, the decoder and the output projection are untouched: decoding
costs what it did. The copy is where training starts:

    tolk extend-source-vocab weights/pt-en runs/pt-en-vocab/init --text data/finetune/train.pt --pieces 8000
    tolk train --init runs/pt-en-vocab/init --spm runs/pt-en-vocab/init/target.spm \\
        --source-spm runs/pt-en-vocab/init/source.spm ...
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch
from sentencepiece.sentencepiece_model_pb2 import ModelProto  # type: ignore[attr-defined]

from model import checkpoint
from model.transformer import Transformer

log = logging.getLogger(__name__)

Proto = Any  # ModelProto: protobuf builds its classes at import time, out of mypy's sight
NORMAL = ModelProto.SentencePiece.NORMAL
COPIED = ("generation.json", "MODEL_CARD.md", "NOTICE")  # int8.json is not: the source's products see new inputs


def read_proto(path: Path) -> Proto:
    proto = ModelProto()
    proto.ParseFromString(path.read_bytes())
    return proto


def extended(old: Proto, new: Proto, count: int) -> tuple[Proto, list[str]]:
    """`old` with up to `count` of `new`'s ordinary pieces that it lacks appended (most likely first), and those
    pieces. Old pieces keep their ids and scores."""
    old_scores = {p.piece: p.score for p in old.pieces}
    both = [(old_scores[p.piece], p.score) for p in new.pieces if p.type == NORMAL and p.piece in old_scores]
    if not both:
        raise ValueError("the two vocabularies share no piece: their scores cannot be put on one scale")
    shift = sum(a - b for a, b in both) / len(both)
    fresh = sorted((p for p in new.pieces if p.type == NORMAL and p.piece not in old_scores),
                   key=lambda p: -p.score)[:count]
    out = ModelProto()
    out.CopyFrom(old)
    for p in fresh:
        out.pieces.add(piece=p.piece, score=p.score + shift, type=NORMAL)
    return out, [p.piece for p in fresh]


def literal_processor(proto: Proto) -> spm.SentencePieceProcessor:
    """`proto` cutting text as it stands: no word boundary added in front and spaces kept, so that a piece's own
    text (a word's start "▁praia" or a word's inside "agem") is cut into the pieces it was made of."""
    copy = ModelProto()
    copy.CopyFrom(proto)
    copy.normalizer_spec.add_dummy_prefix = False
    copy.normalizer_spec.remove_extra_whitespaces = False
    return spm.SentencePieceProcessor(model_proto=copy.SerializeToString())


def piece_rows(table: torch.Tensor, old: Proto, pieces: list[str], unk_id: int) -> torch.Tensor:
    """(len(pieces), D) embeddings: each the mean of `table`'s rows of the old pieces that cut the piece's text."""
    cutter = literal_processor(old)
    rows = []
    for piece in pieces:
        ids = cutter.encode(piece.replace("\u2581", " ")) or [unk_id]
        rows.append(table[ids].mean(dim=0))
    return torch.stack(rows)


def train_pieces(texts: list[Path], vocab_size: int, sample_lines: int, work: Path) -> Proto:
    """A unigram model of `vocab_size` pieces over (a sample of) the lines of `texts`."""
    lines = sorted({line for path in texts for line in path.read_text(encoding="utf-8").splitlines() if line})
    random.Random(0).shuffle(lines)
    sample = work / "sample.txt"
    sample.write_text("\n".join(lines[:sample_lines]) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(sample), model_prefix=str(work / "new"), vocab_size=vocab_size, model_type="unigram",
        character_coverage=0.9999, input_sentence_size=sample_lines, shuffle_input_sentence=True, num_threads=2,
        minloglevel=1,
    )
    return read_proto(work / "new.model")


def extend_model(directory: Path, out: Path, new: Proto, count: int) -> list[str]:
    """Write `directory` to `out` with its source vocabulary extended by up to `count` of `new`'s pieces; returns
    the pieces added."""
    meta = checkpoint.read_meta(directory)
    old = read_proto(directory / "source.spm")
    proto, pieces = extended(old, new, count)
    model = Transformer(meta.cfg)
    checkpoint.read_weights(model, directory / "model.safetensors")
    table = model.src_embed.weight.detach()
    cfg = replace(meta.cfg, src_vocab_size=len(proto.pieces), share_embeddings=False)
    grown = Transformer(cfg)
    state = {k: v for k, v in model.state_dict().items() if k != "src_embed.weight"}
    state["src_embed.weight"] = torch.cat([table, piece_rows(table, old, pieces, cfg.unk_id)])
    grown.load_state_dict(state)
    out.mkdir(parents=True, exist_ok=True)
    (out / "source.spm").write_bytes(proto.SerializeToString())
    shutil.copyfile(directory / "target.spm", out / "target.spm")
    checkpoint.save(out, grown, meta.info, out / "source.spm", out / "target.spm")
    for name in COPIED:
        if (directory / name).exists():
            shutil.copyfile(directory / name, out / name)
    (out / "source_vocab.extended.json").write_text(json.dumps(
        {"from": str(directory), "old_pieces": len(old.pieces), "added": len(pieces)}, indent=2) + "\n")
    return pieces


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path, help="a model directory with one vocabulary for both sides")
    p.add_argument("out", type=Path, help="the extended copy")
    p.add_argument("--text", type=Path, nargs="+", required=True, help="source-language text, a sentence a line")
    p.add_argument("--pieces", type=int, default=8000, help="pieces added at most")
    p.add_argument("--vocab-size", type=int, default=16000, help="the new unigram model's size")
    p.add_argument("--sample-lines", type=int, default=1_000_000, help="distinct lines it learns from")


def main(args: argparse.Namespace) -> int:
    """Write the extended model directory; returns a process exit status."""
    if (args.out / "config.json").exists():
        log.error("%s is a model directory already", args.out)
        return 1
    with tempfile.TemporaryDirectory() as work:
        new = train_pieces(args.text, args.vocab_size, args.sample_lines, Path(work))
    pieces = extend_model(args.model, args.out, new, args.pieces)
    log.info("wrote %s: %d pieces added to the source vocabulary (%s ...)", args.out, len(pieces),
             ", ".join(pieces[:12]))
    return 0
