"""Training steps of `tolk train` on the CPU, paired, in turns: bfloat16 autocast against float32 (`--compare
autocast`), or this step against the plain formulation it replaced (`--compare step`: all logits with the padding
ignored by cross_entropy, PyTorch's default attention kernels and its own dropout). Never run by the tests.

Each round times the same real micro-batches (the corpus's own token-bucketed batches, `model.buckets`) through
`tolk train`'s own step (`model.train.Trainer.loss`, backward, AdamW), once per mode, the order alternating between
rounds; the report is each mode's median seconds per micro-batch, tokens per second and the median of the rounds'
ratios. Prints a table, writes JSON.

    python bench/train_step.py [--compare autocast|step] [--corpus data/corpus] [--model weights/en-pt]
        [--threads 1] [--rounds 5] [-n 6]
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model import checkpoint, layers, train  # noqa: E402  (model before torch: OpenMP's spin setting)
from model.buckets import collate, make_batches  # noqa: E402


def plain_loss(trainer: train.Trainer, model: Any, ids: list[int]) -> tuple[Any, int]:
    """The step's loss as it was computed before: all (B, T, V) logits, cross_entropy ignoring the padding."""
    import torch
    import torch.nn.functional as F

    src, tgt_in, labels = collate(ids, trainer.src, trainer.tgt, trainer.cfg.pad_id, trainer.cfg.decoder_start_id)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=trainer.autocast is not None):
        logits = model(src, tgt_in)
    loss = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=trainer.cfg.pad_id,
                           label_smoothing=trainer.args.label_smoothing)
    return loss, int((src != 0).sum() + (labels != 0).sum())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compare", choices=("autocast", "step"), default="autocast")
    p.add_argument("--corpus", type=Path, default=ROOT / "data/corpus")
    p.add_argument("--model", type=Path, default=ROOT / "weights/en-pt", help="geometry, vocabulary and weights")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("-n", type=int, default=6, help="micro-batches timed per mode and round")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--out", type=Path, default=None,
                   help="default bench/results/train-step-autocast.json or train-step-cpu.json")
    args = p.parse_args()
    import torch
    from engines import cpu_name
    from int8_products import cpu_flags

    torch.set_num_threads(args.threads)
    # `tolk train`'s own Trainer, started from the model's weights; its run folder caches the encoded corpus only,
    # and is new each time: a cache is not checked against the vocabulary that wrote it
    run = Path(tempfile.mkdtemp(prefix="tolk-train-step-"))
    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    targs = parser.parse_args(["--corpus", str(args.corpus), "--run", str(run), "--init", str(args.model),
                               "--device", "cpu", "--threads", str(args.threads)])
    cfg = replace(checkpoint.read_meta(args.model).cfg, dropout=targs.dropout)  # training's dropout, as a run has
    trainer = train.Trainer(targs, cfg, train.model_vocabularies(args.model), ("en", "pt"))
    trainer.model.train()
    batches = make_batches(trainer.src, trainer.tgt, args.max_tokens, targs.max_len, 1)[: args.n]
    tokens = 0

    # the plain step's own copy of the model (its own optimizer), with PyTorch's dropout in place of the CPU one
    plain = copy.deepcopy(trainer.model)
    for module in list(plain.modules()):
        for name, child in module.named_children():
            if isinstance(child, layers.Dropout):
                setattr(module, name, torch.nn.Dropout(child.p))
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=targs.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0)
    autocast = trainer.autocast

    def run_mode(mode: str) -> float:
        nonlocal tokens
        trainer.autocast = None if mode == "float32" else autocast if args.compare == "step" else torch.bfloat16
        opt = plain_opt if mode == "plain" else trainer.opt
        start, tokens = time.perf_counter(), 0
        for ids in batches:
            opt.zero_grad(set_to_none=True)
            loss, n = plain_loss(trainer, plain, ids) if mode == "plain" else trainer.loss(ids)
            loss.backward()
            opt.step()
            tokens += n
        return (time.perf_counter() - start) / len(batches)

    modes = ("float32", "bfloat16") if args.compare == "autocast" else ("plain", "step")
    for mode in modes:
        run_mode(mode)  # warm-up: oneDNN's kernels for these shapes
    times: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            times[mode].append(run_mode(mode))
    ratios = [a / b for a, b in zip(times[modes[0]], times[modes[1]], strict=True)]
    per_batch = tokens / len(batches)
    rows = [{"mode": m, "seconds_per_micro_batch": statistics.median(times[m]),
             "tokens_per_s": per_batch / statistics.median(times[m]), "rounds": times[m]} for m in modes]
    print(f"{args.model.name} geometry, {len(batches)} real micro-batches of about {per_batch:.0f} source + target "
          f"tokens, {args.threads} thread(s), {args.rounds} rounds, "
          f"autocast {autocast if args.compare == 'step' else 'per mode'}, {cpu_name()}")
    print(f"{'mode':10} {'s/micro-batch':>14} {'tokens/s':>9}")
    for row in rows:
        print(f"{row['mode']:10} {row['seconds_per_micro_batch']:14.3f} {row['tokens_per_s']:9.0f}")
    print(f"{modes[1]} speed-up, median of the rounds' ratios: {statistics.median(ratios):.2f}x")
    result = {"compare": args.compare, "model": str(args.model.name), "threads": args.threads,
              "micro_batches": len(batches), "tokens_per_micro_batch": per_batch, "rows": rows,
              "speedup_median": statistics.median(ratios), "ratios": ratios, "cpu": cpu_name(),
              "cpu_flags": cpu_flags(), "torch": torch.__version__}
    name = "train-step-autocast.json" if args.compare == "autocast" else "train-step-cpu.json"
    out = args.out or ROOT / "bench/results" / name
    out.write_text(json.dumps(result, indent=2) + "\n")
    shutil.rmtree(run, ignore_errors=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
