"""One sentence at a time on one thread, as the server's scheduler decodes: Tolk's engine and server against
CTranslate2, and where Tolk's encoder time goes.

1. The shipped model's test sentences translated one at a time, greedy, int8 on both sides, offline, Tolk
   (`model.search.generate`, one row) and CTranslate2 (`translate_batch`, the model converted by
   bench/ct2_convert.py) alternating sentence by sentence: medians and the paired ratio.
2. The same sentences through Tolk's server (`python -m server`, its defaults but no translation cache: one
   request at a time, POST /translate over a kept-alive connection, the reply read) alternating with CTranslate2's
   `translate_batch` on one thread in this process: medians and the median of the paired differences, the issue's
   "one request at a time: at most CTranslate2's batch-1 time plus 2 ms".
3. The encoder of one sentence (`encode_cross`): the fused int8 encoder (model/fused_encoder.py), the
   operator-by-operator one in int8 (fbgemm's products) and in float32 (oneDNN's), alternating, median milliseconds
   by source length.
Prints tables and writes JSON. Never run by the test suite; needs the bench extra (ctranslate2).

    python bench/one_sentence.py [--sentences data/corpus/test.en] [--limit 300]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ct2_convert import TolkConverter, banned_pieces  # noqa: E402
from document_load import free_port  # noqa: E402
from int8_products import cpu_flags  # noqa: E402
from serve import wait_ready  # noqa: E402

from model.checkpoint import LoadedModel, load  # noqa: E402
from model.marian_format import spm_pieces  # noqa: E402
from model.search import generate  # noqa: E402

CT2 = tuple[Any, dict[str, Any], list[str]]  # a translator, its options, the target pieces


def ct2_translator(model_dir: Path, loaded: LoadedModel) -> CT2:
    """CTranslate2 on the model converted (int8, one thread), its options, and the target pieces."""
    import ctranslate2

    ct2_dir = Path(tempfile.mkdtemp()) / "ct2"
    TolkConverter(model_dir).convert(str(ct2_dir), force=True)
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="int8", inter_threads=1,
                                        intra_threads=1)
    pieces = loaded.tokenizer.vocab or spm_pieces(model_dir / "target.spm")
    suppress = [[p] for p in banned_pieces(model_dir)]
    return translator, {"beam_size": 1, "max_decoding_length": 256, "suppress_sequences": suppress}, pieces


def alternate(runs: dict[str, Any], n: int, warm: int = 10) -> dict[str, list[float]]:
    """Sentence i through each run in turn (the order swapped every other sentence), after a warm-up: seconds."""
    for i in range(min(warm, n)):
        for run in runs.values():
            run(i)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(n):
        for name in list(runs) if i % 2 else list(runs)[::-1]:
            start = time.perf_counter()
            runs[name](i)
            times[name].append(time.perf_counter() - start)
    return times


def engines(ct2: CT2, loaded: LoadedModel, lines: list[str]) -> dict[str, Any]:
    translator, options, pieces = ct2
    config = loaded.generation.update(max_new_tokens=256, scores=False)
    ids = [loaded.tokenizer.encode(s) for s in lines]
    tokens = [[pieces[i] for i in s] for s in ids]
    times = alternate({"ct2": lambda i: translator.translate_batch([tokens[i]], **options),
                       "tolk": lambda i: generate(loaded.net, [ids[i]], config, max_rows=1)}, len(ids))
    ratios = [t / c for t, c in zip(times["tolk"], times["ct2"], strict=True)]
    return {"sentences": len(ids), "tolk_median_ms": statistics.median(times["tolk"]) * 1e3,
            "ct2_median_ms": statistics.median(times["ct2"]) * 1e3, "paired_ratio_median": statistics.median(ratios),
            "source_tokens_median": statistics.median(len(s) for s in ids)}


def server(model_dir: Path, ct2: CT2, loaded: LoadedModel, lines: list[str]) -> dict[str, Any]:
    """Tolk's server, one request at a time, against CTranslate2's translate_batch alternating (module docstring)."""
    translator, options, pieces = ct2
    tokens = [[pieces[i] for i in loaded.tokenizer.encode(s)] for s in lines]
    port = free_port()
    env = {**os.environ, "TOLK_DTYPE": "int8", "TOLK_TRANSLATION_CACHE_ENTRIES": "0"}
    process = subprocess.Popen([sys.executable, "-m", "server", "--model", str(model_dir.resolve()), "--port",
                                str(port), "--log-level", "warning"], cwd=ROOT, env=env)
    try:
        wait_ready(f"http://127.0.0.1:{port}", process)
        connection = http.client.HTTPConnection("127.0.0.1", port)

        def request(i: int) -> None:
            body = json.dumps({"q": lines[i], "source": "en", "target": "pt"})
            connection.request("POST", "/translate", body, {"Content-Type": "application/json"})
            reply = connection.getresponse()
            if reply.status != 200:
                raise SystemExit(f"the server answered {reply.status}: {reply.read()!r}")
            reply.read()

        times = alternate({"ct2": lambda i: translator.translate_batch([tokens[i]], **options), "server": request},
                          len(lines))
    finally:
        process.terminate()
        process.wait(30)
    differences = [1e3 * (t - c) for t, c in zip(times["server"], times["ct2"], strict=True)]
    return {"sentences": len(lines), "server_median_ms": statistics.median(times["server"]) * 1e3,
            "ct2_median_ms": statistics.median(times["ct2"]) * 1e3,
            "paired_difference_median_ms": statistics.median(differences)}


def encoder(model_dir: Path, int8: LoadedModel, lines: list[str], rounds: int = 3) -> list[dict[str, Any]]:
    operator = load(model_dir, device="cpu", dtype="int8")
    float32 = load(model_dir, device="cpu", dtype="float32")
    operator.net.fused_encoder = float32.net.fused_encoder = None  # the operator path for every length
    nets = {"fused_int8": int8.net, "int8": operator.net, "float32": float32.net}
    ids = [int8.tokenizer.encode(s) for s in lines]
    times: dict[tuple[str, int], list[float]] = {}
    with torch.inference_mode():
        for s in ids[:20]:
            for net in nets.values():
                net.encode_cross(torch.tensor([s]))
        for r in range(rounds):
            for s in ids:
                order = list(nets.items()) if r % 2 else list(reversed(nets.items()))
                for name, net in order:
                    src = torch.tensor([s])
                    start = time.perf_counter()
                    net.encode_cross(src)
                    times.setdefault((name, len(s) // 8 * 8), []).append(time.perf_counter() - start)
    rows = []
    for low in sorted({k for _, k in times}):
        row: dict[str, Any] = {"tokens": f"{low}-{low + 7}", "sentences": len(times[("int8", low)]) // rounds}
        row.update({f"{name}_ms": statistics.median(times[(name, low)]) * 1e3 for name in nets})
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=ROOT / "weights/en-pt")
    p.add_argument("--sentences", type=Path, default=ROOT / "data/corpus/test.en")
    p.add_argument("--limit", type=int, default=300)
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/one-sentence.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    lines = args.sentences.read_text(encoding="utf-8").splitlines()[:args.limit]
    int8 = load(args.model, device="cpu", dtype="int8")
    ct2 = ct2_translator(args.model, int8)  # converted once, for both comparisons
    result: dict[str, Any] = {"cpu_flags": cpu_flags(), "threads": 1, "torch": torch.__version__,
                              "engines": engines(ct2, int8, lines), "server": server(args.model, ct2, int8, lines),
                              "encoder": encoder(args.model, int8, lines)}
    e, v = result["engines"], result["server"]
    print(f"torch {torch.__version__}, 1 thread, CPU flags: {result['cpu_flags']}")
    print(f"\none sentence at a time, int8, {e['sentences']} sentences (median {e['source_tokens_median']} tokens):")
    print(f"  Tolk {e['tolk_median_ms']:.2f} ms, CTranslate2 {e['ct2_median_ms']:.2f} ms median; "
          f"Tolk / CTranslate2 paired {e['paired_ratio_median']:.2f}x")
    print(f"\none request at a time through Tolk's server against CTranslate2's translate_batch, alternating:\n"
          f"  server {v['server_median_ms']:.2f} ms, CTranslate2 {v['ct2_median_ms']:.2f} ms median; "
          f"paired difference {v['paired_difference_median_ms']:+.2f} ms (target: at most +2)")
    print(f"\nthe encoder, one sentence (ms):\n{'tokens':>8}{'n':>5}{'fused int8':>12}{'int8':>8}{'float32':>10}")
    for row in result["encoder"]:
        print(f"{row['tokens']:>8}{row['sentences']:>5}{row['fused_int8_ms']:>12.2f}{row['int8_ms']:>8.2f}"
              f"{row['float32_ms']:>10.2f}")
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
