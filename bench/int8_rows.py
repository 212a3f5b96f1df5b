"""int8 with a scale per input row (`TOLK_INT8=rows`, model.projection.Rows8) against dynamic int8 (one scale per
call) on the OPUS-MT en-de geometry, where the fused step does not run and every product is fbgemm's.

bench/decode.py's geometry with random weights (seed 0), sources of 24 tokens, 64 new tokens forced; the two loaded
in one process and run in turn, 3 rounds, median seconds per batch; 2 torch threads. Prints a table and writes
bench/results/int8-rows-vs-dynamic.json, with the CPU's vector flags.

    python bench/int8_rows.py [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from decode import OPUS_MT_EN_DE, sources  # noqa: E402
from engines import cpu_name  # noqa: E402
from int8_products import cpu_flags  # noqa: E402

from model import checkpoint  # noqa: E402
from model.generation import GenerationConfig  # noqa: E402
from model.search import generate  # noqa: E402
from model.transformer import Transformer  # noqa: E402

CONFIGS = ((1, 1), (1, 8), (1, 32), (4, 1), (4, 8))  # (beam, batch)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "int8-rows-vs-dynamic.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as work:
        directory = Path(work) / "model"
        checkpoint.save(directory, Transformer(OPUS_MT_EN_DE), checkpoint.ModelInfo("random", "en", "de"),
                        ROOT / "weights" / "en-pt" / "source.spm", ROOT / "weights" / "en-pt" / "target.spm")
        models = {k: checkpoint.load(directory, device="cpu", dtype="int8", int8=k, keep_modules=False)
                  for k in ("rows", "dynamic")}
    rows = []
    print("| decoding | batch | rows (s) | dynamic (s) | rows' speed / dynamic's |\n|---|---:|---:|---:|---:|")
    for beam, batch in CONFIGS:
        src = sources(batch, 24, OPUS_MT_EN_DE.src_vocab_size, batch)
        config = GenerationConfig(max_new_tokens=64, min_new_tokens=64, beam_size=beam)
        times: dict[str, list[float]] = {k: [] for k in models}
        for _ in range(args.rounds):
            for name, lm in models.items():
                with torch.inference_mode():
                    start = time.perf_counter()
                    generate(lm.net, src, config)
                    times[name].append(time.perf_counter() - start)
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {"beam": beam, "batch": batch, "rows_s": med["rows"], "dynamic_s": med["dynamic"],
               "ratio": med["dynamic"] / med["rows"]}
        rows.append(row)
        print(f"| {'greedy' if beam == 1 else f'beam {beam}'} | {batch} | {med['rows']:.3f} | {med['dynamic']:.3f} | "
              f"{row['ratio']:.2f}x |", flush=True)
    result = {"cpu": cpu_name(), "cpu_flags": cpu_flags(), "threads": args.threads, "torch": torch.__version__,
              "rounds": args.rounds, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
