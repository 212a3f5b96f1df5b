"""Decoding speed of the engine on the OPUS-MT en-de geometry with random weights.

Generated tokens per second for greedy and beam 4 at batch 1, 8 and 32, 64 new tokens with end-of-sentence
suppressed (so every configuration generates the same number of tokens), next to a naive decoder that
recomputes the whole prefix at every step, in the same process. Prints a table and writes JSON.

    python bench/decode.py [--threads 2] [--device cpu] [--out bench/results/decode.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from model.checkpoint import resolve_device
from model.config import ModelConfig
from model.frozen import freeze
from model.generation import GenerationConfig
from model.search import generate
from model.transformer import Transformer

OPUS_MT_EN_DE = ModelConfig(
    src_vocab_size=58101, tgt_vocab_size=58101, d_model=512, n_heads=8, encoder_layers=6, decoder_layers=6,
    d_ff=2048, activation="swish", norm="post", pad_id=58100, bos_id=-1, eos_id=0, unk_id=1,
    decoder_start_id=58100, dropout=0.0,
)


def sources(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab - 1, (length - 1,), generator=g).tolist() + [0] for _ in range(batch)]


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of fn() over repeats, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.inference_mode()
def naive_greedy(model: Transformer, src: list[list[int]], new_tokens: int) -> None:
    """The baseline: no cache, the whole target prefix through the decoder at every step."""
    s = torch.tensor(src, device=model.device)
    memory, mask = model.encode(s)
    out = torch.full((len(src), 1), model.cfg.decoder_start_id, device=model.device)
    for _ in range(new_tokens):
        logits = model.decode_full(out, memory, mask)[:, -1]
        out = torch.cat([out, logits.argmax(-1, keepdim=True)], dim=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--src-len", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("bench/results/decode.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = resolve_device(args.device)
    model = Transformer(OPUS_MT_EN_DE).to(device).eval()
    net = freeze(model)
    n = args.new_tokens
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        src = sources(batch, args.src_len, OPUS_MT_EN_DE.src_vocab_size, batch)
        naive = timed(lambda src=src: naive_greedy(model, src, n), 1) if batch <= 8 else None
        for beam in (1, 4):
            config = GenerationConfig(beam_size=beam, min_new_tokens=n, max_new_tokens=n)
            rows_needed = batch * beam
            seconds = timed(lambda src=src, config=config, r=rows_needed: generate(net, src, config, max_rows=r),
                            args.repeats)
            row = {"decoding": "greedy" if beam == 1 else f"beam {beam}", "batch": batch,
                   "tokens_per_s": round(batch * n / seconds, 1), "seconds_per_batch": round(seconds, 3)}
            if beam == 1 and naive is not None:
                row["naive_tokens_per_s"] = round(batch * n / naive, 1)
                row["speedup_vs_naive"] = round(naive / seconds, 2)
            rows.append(row)
            print(row, flush=True)
    print(f"\n{'decoding':<10}{'batch':>6}{'tok/s':>10}{'s/batch':>10}{'naive tok/s':>13}{'x naive':>9}")
    for r in rows:
        print(f"{r['decoding']:<10}{r['batch']:>6}{r['tokens_per_s']:>10}{r['seconds_per_batch']:>10}"
              f"{r.get('naive_tokens_per_s', '-'):>13}{r.get('speedup_vs_naive', '-'):>9}")
    meta = {"torch": torch.__version__, "threads": args.threads, "device": str(device),
            "cpu": platform.processor() or platform.machine(), "new_tokens": n, "src_len": args.src_len,
            "geometry": OPUS_MT_EN_DE.to_dict(),
            "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
