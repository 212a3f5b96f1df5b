"""Model training (`tolk train`): resumable, token-bucketed, label-smoothed, inverse-sqrt warm-up,
gradient accumulation, checkpoint averaging, BLEU/chrF on dev as it goes; CPU and CUDA alike, in bfloat16
autocast where the hardware computes it natively (CUDA; CPUs with AVX-512 BF16 or AMX).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import functools
import json
import logging
import math
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import sentencepiece as spm
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch.nn.attention import SDPBackend, sdpa_kernel

from model import checkpoint
from model.buckets import collate, make_batches
from model.config import ModelConfig
from model.evaluate import score, translate_lines
from model.frozen import freeze
from model.generation import GenerationConfig
from model.tokenizer import Tokenizer
from model.transformer import Transformer
from model.vocab import encode_file, train_vocab

log = logging.getLogger(__name__)

# Deep encoder, shallow decoder: the decoder runs once per generated token, the encoder once per sentence.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=64, n_heads=4, encoder_layers=2, decoder_layers=1, d_ff=256),
    "small": dict(d_model=256, n_heads=4, encoder_layers=6, decoder_layers=2, d_ff=1024),
    "medium": dict(d_model=384, n_heads=6, encoder_layers=6, decoder_layers=2, d_ff=1536),
    "base": dict(d_model=512, n_heads=8, encoder_layers=12, decoder_layers=2, d_ff=2048),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", type=Path, default=Path("data/corpus"),
                   help="train.<lang> and dev.<lang> files of both languages")
    p.add_argument("--run", type=Path, default=Path("runs/en-pt"), help="run directory (resumes if present)")
    p.add_argument("--source", default=None, help="source language code (default: the run's own, else en)")
    p.add_argument("--target", default=None, help="target language code (default: the run's own, else pt)")
    p.add_argument("--spm", type=Path, default=None,
                   help="use this SentencePiece model (copied into a new run) instead of training one")
    p.add_argument("--source-spm", type=Path, default=None,
                   help="the source side's own SentencePiece model (copied into a new run), with an embedding table "
                        "of its own; --spm is then the target's (e.g. a directory of `tolk extend-source-vocab`)")
    p.add_argument("--arch", choices=sorted(ARCHITECTURES), default="small")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--max-tokens", type=int, default=4096, help="padded tokens per micro-batch")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--max-len", type=int, default=128, help="longest sentence kept, in tokens")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=1500)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--max-steps", type=int, default=100_000)
    p.add_argument("--max-hours", type=float, default=0.0, help="stop after this long (0 = no limit)")
    p.add_argument("--eval-every", type=int, default=1000)
    p.add_argument("--save-every", type=int, default=500)
    p.add_argument("--average", type=int, default=5, help="snapshots averaged on export")
    p.add_argument("--dev-sentences", type=int, default=400)
    p.add_argument("--device", default="auto")
    p.add_argument("--autocast", choices=("auto", "bfloat16", "off"), default="auto",
                   help="bfloat16 autocast for forward passes (weights and optimizer stay float32); auto: on CUDA "
                        "and on CPUs with native bfloat16 (AVX-512 BF16, AMX), where it is faster")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--export", type=Path, default=None, help="write the averaged model directory here and stop")
    p.add_argument("--default-beam-size", type=int, default=1, help="the exported model's default beam size")
    p.add_argument("--init", type=Path, default=None,
                   help="a new run starts from this model directory's weights (same architecture and vocabulary), "
                        "e.g. an earlier run's export: training carried across machines")
    p.add_argument("--weights-dtype", choices=checkpoint.STORAGE_DTYPES, default="float32",
                   help="the exported weights' dtype: float16 ships half the bytes and loads as float32")


def lr_at(step: int, peak: float, warmup: int) -> float:
    """Inverse square root schedule with linear warm-up."""
    step = max(step, 1)
    return peak * min(step / warmup, math.sqrt(warmup / step))


def run_languages(run: Path, source: str | None, target: str | None) -> tuple[str, str]:
    """The run's (source, target) languages, stored in run/languages.json on its first start.

    Resuming keeps the stored direction and refuses another one; runs from before this file existed were en->pt.
    """
    path = run / "languages.json"
    if path.exists():
        stored = json.loads(path.read_text())
        languages = (str(stored["source"]), str(stored["target"]))
    elif (run / "config.json").exists():
        languages = ("en", "pt")
    else:
        languages = (source or "en", target or "pt")
    if (source or languages[0], target or languages[1]) != languages:
        raise ValueError(f"run {run} trains {languages[0]}->{languages[1]}; --source/--target ask for "
                         f"{source or languages[0]}->{target or languages[1]} (start a new --run)")
    if languages[0] == languages[1]:
        raise ValueError(f"--source and --target are both {languages[0]!r}")
    path.write_text(json.dumps({"source": languages[0], "target": languages[1]}) + "\n")
    return languages


@dataclass(frozen=True)
class Vocabularies:
    """A run's SentencePiece models: one for both sides (the same path twice), or the source's own beside the
    target's; then the source has an embedding table of its own."""

    source: Path
    target: Path

    @property
    def shared(self) -> bool:
        return self.source == self.target


def model_vocabularies(directory: Path) -> Vocabularies:
    """A model directory's vocabularies as a run started from it has them: its target.spm for both sides, or beside
    it its source.spm where that is a vocabulary of its own."""
    target, source = directory / "target.spm", directory / "source.spm"
    own = source.exists() and source.read_bytes() != target.read_bytes()
    return Vocabularies(source if own else target, target)


def _run_copy(given: Path | None, path: Path, option: str) -> None:
    if given is None:
        return
    if not path.exists():
        shutil.copyfile(given, path)
    elif path.read_bytes() != given.read_bytes():
        raise ValueError(f"{option} {given} differs from the run's own {path}")


def run_vocabulary(args: argparse.Namespace, languages: tuple[str, str]) -> Vocabularies:
    """The run's SentencePiece models: given ones copied in, else the one trained on both sides (and kept)."""
    _run_copy(args.spm, args.run / "spm.model", "--spm")
    # sorted: the same vocabulary for either direction (and en, pt as runs before --source had it)
    target = train_vocab([args.corpus / f"train.{lang}" for lang in sorted(languages)], args.run / "spm",
                         args.vocab_size)
    source = args.run / "source_spm.model"
    _run_copy(args.source_spm, source, "--source-spm")
    return Vocabularies(source if source.exists() else target, target)


def build_config(args: argparse.Namespace, vocab_size: int, source_vocab_size: int | None = None) -> ModelConfig:
    """A new run's model; `source_vocab_size`: the source's own vocabulary, with its own embedding table."""
    return ModelConfig(
        src_vocab_size=source_vocab_size or vocab_size, tgt_vocab_size=vocab_size, activation="relu", norm="pre",
        share_embeddings=source_vocab_size is None, tie_output=True, output_bias=False, max_positions=512,
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, decoder_start_id=1, dropout=args.dropout,
        **ARCHITECTURES[args.arch],
    )


def snapshots(run: Path) -> list[Path]:
    return sorted(run.glob("snapshot_*.safetensors"), key=lambda p: int(p.stem.split("_")[1]))


def save_snapshot(run: Path, model: Transformer, step: int, keep: int) -> None:
    state: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for k, v in model.state_dict().items():
        if v.data_ptr() not in seen:  # tied tables once; load_state_dict(strict=False) re-ties them
            seen.add(v.data_ptr())
            state[k] = v.detach().float().cpu().contiguous()
    save_file(state, str(run / f"snapshot_{step}.safetensors"))
    for old in snapshots(run)[:-keep]:
        old.unlink()


def averaged(run: Path, cfg: ModelConfig, count: int) -> Transformer:
    """Mean of the last `count` snapshots' weights."""
    paths = snapshots(run)[-count:]
    if not paths:
        raise FileNotFoundError(f"no snapshots in {run}")
    total: dict[str, torch.Tensor] = {}
    for path in paths:
        for k, v in load_file(str(path)).items():
            total[k] = total.get(k, torch.zeros_like(v)) + v / len(paths)
    model = Transformer(replace(cfg, dropout=0.0))
    model.load_state_dict(total, strict=False)
    log.info("averaged %d snapshots: %s", len(paths), [p.stem for p in paths])
    return model.eval()


def export(args: argparse.Namespace, cfg: ModelConfig, vocab: Vocabularies, languages: tuple[str, str]) -> None:
    model = averaged(args.run, cfg, args.average)
    info = checkpoint.ModelInfo("-".join(languages), *languages)
    generation = {"beam_size": args.default_beam_size, "max_new_tokens": 256}
    checkpoint.save(args.export, model, info, vocab.source, vocab.target, generation=generation,
                    weights_dtype=args.weights_dtype)
    log.info("wrote %s", args.export)


def native_bfloat16(device: torch.device) -> bool:
    """Whether bfloat16 matrix products run natively here: on a CPU without it oneDNN emulates them, slower than
    float32."""
    if device.type == "cuda":
        return True
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private: absent in some builds
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def autocast_dtype(choice: str, device: torch.device) -> torch.dtype | None:
    if choice == "off" or (choice == "auto" and not native_bfloat16(device)):
        return None
    return torch.bfloat16


def evaluate_dev(model: Transformer, vocab: Vocabularies, src: list[str], ref: list[str]) -> dict[str, float]:
    tok = Tokenizer(spm.SentencePieceProcessor(model_file=str(vocab.source)),
                    spm.SentencePieceProcessor(model_file=str(vocab.target)), model.cfg.eos_id, model.cfg.unk_id)
    model.eval()
    start = time.perf_counter()
    hyps = translate_lines(freeze(model), tok, src, GenerationConfig(max_new_tokens=160))
    s = score(hyps, ref, time.perf_counter() - start)
    model.train()
    log.info("dev example: %s => %s", src[0], hyps[0])
    return {"bleu": s.bleu, "chrf": s.chrf, "dev_seconds": s.seconds}


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    args.run.mkdir(parents=True, exist_ok=True)
    languages = run_languages(args.run, args.source, args.target)
    vocab = run_vocabulary(args, languages)
    size = spm.SentencePieceProcessor(model_file=str(vocab.target)).get_piece_size()
    source_size = None if vocab.shared else spm.SentencePieceProcessor(model_file=str(vocab.source)).get_piece_size()
    cfg_path = args.run / "config.json"
    cfg = ModelConfig.load(cfg_path) if cfg_path.exists() else build_config(args, size, source_size)
    cfg.save(cfg_path)
    if args.export:
        export(args, cfg, vocab, languages)
        return 0
    Trainer(args, cfg, vocab, languages).run()
    return 0


def init_weights(model: Transformer, directory: Path, vocab: Vocabularies) -> None:
    """Start from a model directory's weights; its vocabularies and architecture must be the run's."""
    for name, path in (("source.spm", vocab.source), ("target.spm", vocab.target)):
        theirs = (directory / name).read_bytes()
        if theirs != path.read_bytes():
            own = name == "source.spm" and path == vocab.target and theirs != (directory / "target.spm").read_bytes()
            hint = " (its source has a vocabulary of its own: pass it as --source-spm)" if own else ""
            raise ValueError(f"--init {directory}: its {name} is not the run's vocabulary ({path}){hint}")
    meta = checkpoint.read_meta(directory)
    shape = {k: v for k, v in meta.cfg.to_dict().items() if k not in ("dropout", "attention_dropout")}
    ours = {k: v for k, v in model.cfg.to_dict().items() if k not in ("dropout", "attention_dropout")}
    if shape != ours:
        raise ValueError(f"--init {directory}: its architecture differs from the run's: "
                         f"{ {k: (v, ours[k]) for k, v in shape.items() if ours.get(k) != v} }")
    checkpoint.read_weights(model, directory / "model.safetensors")  # tied tables saved once; float16 upcast
    log.info("started from the weights of %s", directory)


class _SmoothedCrossEntropy(torch.autograd.Function):
    """`F.cross_entropy(logits.float(), labels, label_smoothing=eps)` (the mean over rows) computed a few rows at a
    time in float32 from logits of any dtype: each row's loss is logsumexp(z) - (1 - eps) z[label] - eps mean(z),
    its gradient softmax(z) - (1 - eps) onehot(label) - eps / V. The vocabulary-wide tensors PyTorch's own makes
    (float32 copy, log-softmax, zeros, their sum, the cast back) never exist whole: on the CPU it takes a third
    of the time (`bench/train_step.py`)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor, eps: float) -> torch.Tensor:
        n, v = logits.shape
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        total = torch.zeros((), dtype=torch.float64, device=logits.device)
        for a in range(0, n, CE_ROWS):
            z = logits[a : a + CE_ROWS].float()
            lse[a : a + CE_ROWS] = row_lse = torch.logsumexp(z, dim=1)
            picked = z.gather(1, labels[a : a + CE_ROWS, None]).squeeze(1)
            total += (row_lse - (1 - eps) * picked - (eps / v) * z.sum(1)).sum(dtype=torch.float64)
        ctx.save_for_backward(logits, labels, lse)
        ctx.eps = eps
        return (total / n).float()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, labels, lse = ctx.saved_tensors
        n, v = logits.shape
        eps, scale = ctx.eps, grad.float() / n
        out = torch.empty_like(logits)
        for a in range(0, n, CE_ROWS):
            p = logits[a : a + CE_ROWS].to(torch.float32, copy=True).sub_(lse[a : a + CE_ROWS, None]).exp_()
            p.sub_(eps / v).scatter_add_(1, labels[a : a + CE_ROWS, None], p.new_full((p.shape[0], 1), eps - 1))
            out[a : a + CE_ROWS] = p.mul_(scale)
        return out, None, None


CE_ROWS = 32  # rows of the loss at a time: 32 x 8,000 float32 logits are 1 MB, within a core's L2


def smoothed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, eps: float) -> torch.Tensor:
    """The mean label-smoothed cross-entropy of (N, V) logits against (N,) labels, no padding among them; on the
    CPU a few rows at a time, elsewhere (where a loop of small launches would cost more) PyTorch's own."""
    if logits.device.type != "cpu":
        return F.cross_entropy(logits.float(), labels, label_smoothing=eps)
    out: torch.Tensor = _SmoothedCrossEntropy.apply(logits, labels, eps)  # type: ignore[no-untyped-call]
    return out


def training_attention(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """The attention kernels a training step's forward pass (and so its backward) uses: on the CPU, the math
    path; elsewhere PyTorch's own choice."""
    return sdpa_kernel(SDPBackend.MATH) if device.type == "cpu" else contextlib.nullcontext()


TRIM_EVERY = 10  # steps between two returns of the C allocator's free memory to the system (CPU runs)


@functools.cache
def _malloc_trim() -> Any:
    """glibc's malloc_trim, or None where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory(device: torch.device) -> None:
    """Give the C allocator's free pages back to the system. Batches of every length make PyTorch's CPU tensors
    every size, and glibc keeps what they free in its heap, scattered: a CPU run grew by several GB an hour without
    this (`bench/train_memory.py`)."""
    trim = _malloc_trim() if device.type == "cpu" else None
    if trim is not None:
        trim(0)


class Trainer:
    """The training loop's state: model, optimizer, position in the data; saved and restored whole."""

    def __init__(self, args: argparse.Namespace, cfg: ModelConfig, vocab: Vocabularies,
                 languages: tuple[str, str]) -> None:
        self.args, self.cfg, self.vocab = args, cfg, vocab
        self.device = checkpoint.resolve_device(args.device)
        self.autocast = autocast_dtype(args.autocast, self.device)
        run, corpus = args.run, args.corpus
        source, target = languages
        # caches are named by language, not role: the same file encodes the same either way round
        source_sp, target_sp = (spm.SentencePieceProcessor(model_file=str(p)) for p in (vocab.source, vocab.target))
        self.src = encode_file(source_sp, corpus / f"train.{source}", run / f"train.{source}.npz")
        self.tgt = encode_file(target_sp, corpus / f"train.{target}", run / f"train.{target}.npz")
        n_dev = args.dev_sentences
        self.dev_src = (corpus / f"dev.{source}").read_text(encoding="utf-8").splitlines()[:n_dev]
        self.dev_ref = (corpus / f"dev.{target}").read_text(encoding="utf-8").splitlines()[:n_dev]
        self.model = Transformer(cfg).to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9,
                                     weight_decay=0.0)
        self.step, self.epoch, self.position = 0, 0, 0
        self.state_path = run / "state.pt"
        if self.state_path.exists():
            state = torch.load(self.state_path, map_location=self.device, weights_only=True)
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["opt"])
            self.step, self.epoch, self.position = state["step"], state["epoch"], state["position"]
            log.info("resumed at step %d (epoch %d, batch %d)", self.step, self.epoch, self.position)
        elif args.init is not None:
            init_weights(self.model, args.init, vocab)
        log.info("%s->%s model: %s, %.1fM parameters, %d training pairs, device %s, autocast %s", source, target,
                 cfg.to_dict(), self.model.num_parameters() / 1e6, len(self.src), self.device, self.autocast)

    def save(self) -> None:
        state = {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                 "epoch": self.epoch, "position": self.position}
        tmp = self.state_path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(self.state_path)
        save_snapshot(self.args.run, self.model, self.step, self.args.average)

    def loss(self, ids: list[int]) -> tuple[torch.Tensor, int]:
        """The label-smoothed cross-entropy of one micro-batch, averaged over its real target tokens, and the
        batch's real source + target token count.

        Only the real target positions are projected onto the vocabulary (the padding's logits would be ignored),
        as one contiguous (tokens, vocabulary) block, and the loss is taken a few rows at a time
        (`smoothed_cross_entropy`); on the CPU the attention runs as plain matrix products and a
        softmax, whose backward pass is several times cheaper than the fused CPU kernel's (`bench/train_step.py`)."""
        batch = collate(ids, self.src, self.tgt, self.cfg.pad_id, self.cfg.decoder_start_id)
        src, tgt_in, labels = (t.to(self.device) for t in batch)
        real = labels != self.cfg.pad_id
        enabled = self.autocast is not None
        with (torch.autocast(self.device.type, dtype=self.autocast or torch.bfloat16, enabled=enabled),
              training_attention(self.device)):
            memory, src_mask = self.model.encode(src)
            logits = self.model.logits(self.model.decode_states(tgt_in, memory, src_mask)[real])
        loss = smoothed_cross_entropy(logits, labels[real], self.args.label_smoothing)
        return loss, int((src != self.cfg.pad_id).sum() + real.sum())

    def log_progress(self, log_file: TextIO, bar: Any, loss: float, rate: float) -> None:
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:.0f}", epoch=self.epoch)
        log_file.write(json.dumps({"step": self.step, "loss": round(loss, 4), "tokens_per_s": round(rate),
                                   "epoch": self.epoch}) + "\n")
        log_file.flush()

    def train_step(self, micro_batches: list[list[int]]) -> tuple[float, int]:
        """One optimizer step over these `--accum` micro-batches (gradients accumulated, clipped, AdamW at the scheduled
        rate); on the CPU every `TRIM_EVERY` steps the allocator's free memory goes back to the system. Returns the
        step's mean loss and its real token count."""
        args = self.args
        for g in self.opt.param_groups:
            g["lr"] = lr_at(self.step + 1, args.lr, args.warmup)
        self.opt.zero_grad(set_to_none=True)
        total, tokens = 0.0, 0
        for ids in micro_batches:
            loss, n = self.loss(ids)
            (loss / args.accum).backward()
            total += float(loss.detach()) / args.accum
            tokens += n
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.step += 1
        if self.step % TRIM_EVERY == 0:
            release_freed_memory(self.device)
        return total, tokens

    def run(self) -> None:
        from tqdm import tqdm  # training extra

        args = self.args
        deadline = time.time() + args.max_hours * 3600 if args.max_hours else math.inf
        log_file = (args.run / "log.jsonl").open("a")
        bar = tqdm(total=args.max_steps, initial=self.step, dynamic_ncols=True, mininterval=5)
        self.model.train()
        tokens, t0, total = 0, time.perf_counter(), math.nan
        while self.step < args.max_steps and time.time() < deadline:
            batches = make_batches(self.src, self.tgt, args.max_tokens, args.max_len, args.seed + self.epoch)
            while self.position + args.accum <= len(batches) and self.step < args.max_steps:
                total, n = self.train_step(batches[self.position : self.position + args.accum])
                tokens += n
                self.position += args.accum
                bar.update(1)
                if self.step % 50 == 0:
                    self.log_progress(log_file, bar, total, tokens / (time.perf_counter() - t0))
                    tokens, t0 = 0, time.perf_counter()
                if self.step % args.save_every == 0:
                    self.save()
                if self.step % args.eval_every == 0:
                    result = evaluate_dev(self.model, self.vocab, self.dev_src, self.dev_ref)
                    log.info("step %d dev %s", self.step, result)
                    log_file.write(json.dumps({"step": self.step, "dev": result}) + "\n")
                if time.time() >= deadline:
                    break
            else:
                self.epoch += 1
                self.position = 0
        if tokens:  # the steps since the last record: a short run leaves one too
            self.log_progress(log_file, bar, total, tokens / (time.perf_counter() - t0))
        self.save()
        bar.close()
        log_file.close()


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(_parser)
    raise SystemExit(main(_parser.parse_args()))
