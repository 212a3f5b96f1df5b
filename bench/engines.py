"""Tolk's decoding engine against transformers' generate and CTranslate2, on identical weights, in one run.

(a) forced: the OPUS-MT en-de geometry with random weights (bench/decode.py's), 24-token sources, 64 new tokens
    with end-of-sentence suppressed so every engine generates the same tokens' worth of work. Tolk's model is
    exported by `tolk export-marian` (model/marian_export.py), loaded by transformers' MarianMTModel and converted by
    CTranslate2's TransformersConverter.
(b) corpus: a Tolk model directory (default weights/en-pt) translating the test split for real. transformers runs
    it only if export-marian can export it (its Marian has no pre-norm variant); CTranslate2 gets it through
    bench/ct2_convert.py, which reads Tolk's weights directly.

Greedy and beam 4 at batch 1, 8 and 32 (CPU) or 1, 8, 32 and 64 (CUDA). Each engine runs in its own worker
process (bench/workers.py), so its peak memory (VmHWM, reset before each configuration; on CUDA also the peak of
torch's allocator, which CTranslate2 does not use) is its own. An engine that fails to load or to run a first
job (a missing CUDA library, say) is skipped with its reason. Engines take turns (rotating order) after a
warm-up; (a) reports medians of --repeats runs, (b) totals over the split, cut into --repeats segments taken in
turn. Prints markdown tables, writes JSON and a PNG plot.

    python bench/engines.py [--quick] [--limit N] [--engines tolk,transformers,ct2,ct2-int8]
    python bench/engines.py --device cuda [--engines tolk-float16,tolk,ct2-float16,transformers]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch
from decode import OPUS_MT_EN_DE, sources
from int8_products import cpu_flags
from workers import ENGINES, MAX_SOURCE_TOKENS, EngineFailed, EngineSpec, Job, Pieces, Result, Worker, engine_kind

from model import checkpoint
from model.config import ModelConfig
from model.marian_export import export_marian
from model.marian_format import UnsupportedCheckpoint, spm_pieces
from model.transformer import Transformer

SETTLE_S = 0.2  # pause between engines, so the last one's OpenMP threads have stopped spinning and sleep


def rotated(names: list[str], k: int) -> list[str]:
    return names[k % len(names):] + names[: k % len(names)]


def reference_engine(names: list[str]) -> str:
    """Whose outputs the others are compared with: transformers' when it runs, else the first engine's."""
    return "transformers" if "transformers" in names else names[0]


def same_share(outputs: Pieces, reference: Pieces) -> float:
    """Percentage of sentences whose tokens equal the reference's."""
    return round(100 * sum(a == b for a, b in zip(outputs, reference, strict=True)) / len(reference), 1)


def row(name: str, beam: int, batch: int, tokens: int, sentences: int, total_s: float, batch_s: float,
        peak: Result, worker: Worker) -> dict[str, Any]:
    r = {"engine": name, "decoding": "greedy" if beam == 1 else f"beam {beam}", "batch": batch,
         "tokens_per_s": round(tokens / total_s, 1), "sentences_per_s": round(sentences / total_s, 2),
         "seconds_per_batch": round(batch_s, 4), "peak_rss_mb": round(peak.peak_rss_mb), "peak_over_start_mb":
         round(peak.peak_rss_mb - worker.before_load_mb), "generated_tokens": tokens}
    if worker.spec.device == "cuda":  # None for CTranslate2: its own allocator, not torch's
        r["peak_gpu_mb"] = None if peak.peak_gpu_mb is None else round(peak.peak_gpu_mb)
    return r


def bench_forced(workers: dict[str, Worker], pieces: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """(a): every engine on the same batch --repeats times, in rotating order, after one warm-up each."""
    rows, names, n = [], list(workers), args.new_tokens
    for beam in args.beams:
        for batch in args.batches:
            src = [[pieces[i] for i in s] for s in sources(batch, args.src_len, OPUS_MT_EN_DE.src_vocab_size, batch)]
            job = Job(src, beam, n, n)
            times: dict[str, list[float]] = {name: [] for name in names}
            outputs: dict[str, Pieces] = {}
            peaks: dict[str, Result] = {}
            for name in names:
                workers[name].run(job, reset=True)
                time.sleep(SETTLE_S)
            for k in range(args.repeats):
                for name in rotated(names, k):
                    peaks[name] = workers[name].run(job)
                    outputs[name] = peaks[name].outputs
                    times[name].append(peaks[name].seconds)
                    time.sleep(SETTLE_S)
            reference = outputs[reference_engine(names)]
            for name in names:
                if any(len(o) != n for o in outputs[name]):
                    raise RuntimeError(f"{name} generated other than {n} tokens per sentence")
                median = statistics.median(times[name])
                rows.append({**row(name, beam, batch, batch * n, batch, median, median, peaks[name], workers[name]),
                             "same_pct": same_share(outputs[name], reference)})
                print(rows[-1], flush=True)
    return rows


def bench_corpus(workers: dict[str, Worker], src: Pieces, max_new: int,
                 args: argparse.Namespace) -> list[dict[str, Any]]:
    """(b): every engine translates the whole split per configuration, segment by segment in rotating order."""
    rows, names = [], list(workers)
    for beam in args.beams:
        for batch in args.batches:
            chunks = [src[i : i + batch] for i in range(0, len(src), batch)]
            per_segment = -(-len(chunks) // args.repeats)
            segments = [chunks[i : i + per_segment] for i in range(0, len(chunks), per_segment)]
            times: dict[str, list[float]] = {name: [] for name in names}
            outputs: dict[str, Pieces] = {name: [] for name in names}
            peaks: dict[str, Result] = {}
            for name in names:
                workers[name].run(Job(chunks[0], beam, 0, max_new), reset=True)
                time.sleep(SETTLE_S)
            for k, segment in enumerate(segments):
                for name in rotated(names, k):
                    for chunk in segment:
                        peaks[name] = workers[name].run(Job(chunk, beam, 0, max_new))
                        times[name].append(peaks[name].seconds)
                        outputs[name] += peaks[name].outputs
                    time.sleep(SETTLE_S)
            for name in names:
                tokens = sum(len(o) for o in outputs[name])
                r = row(name, beam, batch, tokens, len(src), sum(times[name]), statistics.median(times[name]),
                        peaks[name], workers[name])
                rows.append({**r, "same_pct": same_share(outputs[name], outputs[reference_engine(names)])})
                print(rows[-1], flush=True)
    return rows


def random_model(work: Path, spm_dir: Path) -> tuple[Path, list[str]]:
    """(a)'s model directory: bench/decode.py's random weights with a Marian-style vocabulary (</s> 0, <unk> 1,
    made-up pieces, <pad> last); the SentencePiece files are borrowed from spm_dir and never used."""
    V = OPUS_MT_EN_DE.src_vocab_size
    pieces = ["</s>", "<unk>", *(f"\u2581w{i}" for i in range(2, V - 1)), "<pad>"]
    torch.manual_seed(0)
    out = work / "random"
    checkpoint.save(out, Transformer(OPUS_MT_EN_DE), checkpoint.ModelInfo("random-opus-mt-en-de", "en", "de"),
                    spm_dir / "source.spm", spm_dir / "target.spm", vocab=pieces)
    return out, pieces


@dataclass(frozen=True)
class Converted:
    """One Tolk model's files for the other engines."""

    hf_dir: Path | None  # export-marian's output; None when it refuses the model
    hf_refusal: str | None  # why it did
    ct2_dir: Path
    suppress: tuple[str, ...]  # pieces CTranslate2 must never generate


def convert(tolk_dir: Path, work: Path, direct: bool) -> Converted:
    """Export for transformers and convert for CTranslate2: from the export with TransformersConverter, or with
    direct=True (or when export-marian refuses the model) from Tolk's weights with bench/ct2_convert.py."""
    from ct2_convert import TolkConverter, banned_pieces  # imports ctranslate2: kept out of the workers
    from ctranslate2.converters import TransformersConverter

    hf_dir: Path | None = work / f"{tolk_dir.name}-hf"
    refusal = None
    try:
        export_marian(tolk_dir, work / f"{tolk_dir.name}-hf")
    except UnsupportedCheckpoint as e:  # transformers' Marian is post-norm only
        hf_dir, refusal = None, f"export-marian refuses {tolk_dir}: {e}"
        print(f"transformers skipped: {refusal}", flush=True)
    ct2_dir = work / f"{tolk_dir.name}-ct2"
    if direct or hf_dir is None:
        TolkConverter(tolk_dir).convert(str(ct2_dir), force=True)
        return Converted(hf_dir, refusal, ct2_dir, tuple(banned_pieces(tolk_dir)))
    TransformersConverter(str(hf_dir)).convert(str(ct2_dir), force=True)
    return Converted(hf_dir, refusal, ct2_dir, ())  # Marian's pad, the one banned piece, is dropped by the converter


def read_bandwidth_gbs(repeats: int = 10, mib: int = 1024) -> float:
    """Memory read bandwidth: the fastest of several sums over a tensor far larger than the caches."""
    x = torch.ones(mib * 2**20 // 4)
    x.sum()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.numel() * 4 / best / 1e9


def step_bytes(cfg: ModelConfig) -> int:
    """float32 bytes of weights one decoder step reads: the decoder layers (cross-attention K/V are computed
    once per source) and the output projection; one embedding row is negligible."""
    model = Transformer(cfg)
    once = (".cross_attn.k_proj.", ".cross_attn.v_proj.")
    n = sum(p.numel() for name, p in model.named_parameters()
            if name.startswith(("decoder.", "decoder_norm.", "out_bias")) and not any(s in name for s in once))
    return 4 * (n + model.out_proj.weight.numel())


def specs(names: list[str], device: str, tolk_dir: Path, files: Converted, threads: int) -> list[EngineSpec]:
    return [EngineSpec(n, device, tolk_dir, files.hf_dir, files.ct2_dir, files.suppress, threads) for n in names
            if engine_kind(n, device)[0] != "transformers" or files.hf_dir is not None]


def with_workers(engine_specs: list[EngineSpec], probe: Job, fn: Callable[[dict[str, Worker]], list[dict[str, Any]]]
                 ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, str]]:
    """Start one worker per engine and run the probe job on it, run fn(workers) -> rows, stop them; also the
    workers' load-time memory and the engines skipped because loading or the probe failed (with why)."""
    workers: dict[str, Worker] = {}
    skipped: dict[str, str] = {}
    try:
        for spec in engine_specs:
            worker = None
            try:
                worker = Worker(spec)
                worker.run(probe)
                workers[spec.name] = worker
            except EngineFailed as e:
                skipped[spec.name] = str(e)
                print(f"skipped: {e}", flush=True)
                if worker is not None:
                    worker.close()
        if not workers:
            raise SystemExit(f"every engine failed: {skipped}")
        memory = {n: {"rss_before_load_mb": round(w.before_load_mb), "rss_loaded_mb": round(w.loaded_mb),
                      "rss_load_peak_mb": round(w.load_peak_mb), "numba_imported": w.numba}
                  for n, w in workers.items()}
        return fn(workers), memory, skipped
    finally:
        for w in workers.values():
            w.close()


def ran(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["engine"] for r in rows))


def markdown(rows: list[dict[str, Any]], reference: str) -> str:
    gpu = "peak_gpu_mb" in rows[0]  # CUDA runs: torch's allocator peak, "-" for CTranslate2
    lines = ["| engine | decoding | batch | tokens/s | sentences/s | s per batch | peak RSS MB (+ over worker start) "
             + ("| peak GPU MB (torch allocator) " if gpu else "") + f"| same tokens as {reference} |",
             "|---|---|---:|---:|---:|---:|---:|" + ("---:|" if gpu else "") + "---:|"]
    for r in rows:
        peak_gpu = f"{'-' if r['peak_gpu_mb'] is None else r['peak_gpu_mb']} | " if gpu else ""
        lines.append(f"| {r['engine']} | {r['decoding']} | {r['batch']} | {r['tokens_per_s']} | "
                     f"{r['sentences_per_s']} | {r['seconds_per_batch']} | {r['peak_rss_mb']} "
                     f"(+{r['peak_over_start_mb']}) | {peak_gpu}{r['same_pct']}% |")
    return "\n".join(lines)


def pivot(rows: list[dict[str, Any]]) -> str:
    """Tokens/s with one column per engine."""
    names = list(dict.fromkeys(r["engine"] for r in rows))
    keys = list(dict.fromkeys((r["decoding"], r["batch"]) for r in rows))
    cell = {(r["decoding"], r["batch"], r["engine"]): r["tokens_per_s"] for r in rows}
    lines = ["| decoding | batch | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    lines += [f"| {d} | {b} | " + " | ".join(str(cell.get((d, b, n), "-")) for n in names) + " |" for d, b in keys]
    return "\n".join(lines)


def report(title: str, rows: list[dict[str, Any]], reference: str) -> None:
    print(f"\n## {title}\n\n{pivot(rows)}\n\n{markdown(rows, reference)}\n", flush=True)


def bound_report(rows: list[dict[str, Any]], nbytes: int, bandwidth: float) -> dict[str, Any]:
    """Batch-1 greedy against the memory-bandwidth bound (weights read once per step)."""
    step_ms = nbytes / (bandwidth * 1e9) * 1e3
    shares = {r["engine"]: round(100 * r["tokens_per_s"] * step_ms / 1e3, 1)
              for r in rows if r["decoding"] == "greedy" and r["batch"] == 1}
    print(f"memory-bandwidth bound, batch 1 greedy: {nbytes / 1e6:.0f} MB of float32 weights per step / "
          f"{bandwidth:.1f} GB/s read = {step_ms:.2f} ms per step ({1e3 / step_ms:.0f} tokens/s at most); "
          + ", ".join(f"{n} {s}%" for n, s in shares.items()) + " of that float32 bound", flush=True)
    return {"bytes_per_step": nbytes, "read_gbs": round(bandwidth, 2), "ms_per_step": round(step_ms, 3),
            "percent_of_bound": shares}


def corpus(model_dir: Path, src: Path, limit: int) -> tuple[Pieces, int]:
    """(b)'s sources as Tolk tokenizes them (cut at 256 tokens, as model.evaluate does) and the length limit."""
    loaded = checkpoint.load(model_dir, device="cpu")
    tok = loaded.tokenizer
    pieces = tok.vocab or spm_pieces(model_dir / "source.spm")
    lines = src.read_text(encoding="utf-8").splitlines()[: limit or None]
    sources = [[pieces[i] for i in tok.encode(line)[:MAX_SOURCE_TOKENS]] for line in lines]
    return sources, loaded.generation.max_new_tokens


def memory_report(memory: dict[str, dict[str, int]]) -> None:
    """Each worker's RSS before loading its engine, once loaded, and its peak while loading (VmHWM)."""
    print("| engine | RSS before loading MB | loaded MB (+) | peak while loading MB (+) |\n|---|---:|---:|---:|")
    for name, m in memory.items():
        before = m["rss_before_load_mb"]
        print(f"| {name} | {before} | {m['rss_loaded_mb']} (+{m['rss_loaded_mb'] - before}) | "
              f"{m['rss_load_peak_mb']} (+{m['rss_load_peak_mb'] - before}) |", flush=True)


def run_forced(args: argparse.Namespace, names: list[str], work: Path, bandwidth: float | None) -> dict[str, Any]:
    tolk_dir, pieces = random_model(work, args.model)
    engine_specs = specs(names, args.device, tolk_dir, convert(tolk_dir, work, direct=False), args.threads)
    probe = Job([[pieces[i] for i in s] for s in sources(1, args.src_len, OPUS_MT_EN_DE.src_vocab_size, 1)], 1, 2, 2)
    rows, memory, skipped = with_workers(engine_specs, probe, lambda w: bench_forced(w, pieces, args))
    reference = reference_engine(ran(rows))
    report(f"(a) OPUS-MT en-de geometry, random weights, {args.new_tokens} tokens forced", rows, reference)
    memory_report(memory)
    if bandwidth is None:
        print("memory-bandwidth bound: not computed on CUDA (batch 1 there is bound by kernel launches)", flush=True)
    bound = None if bandwidth is None else bound_report(rows, step_bytes(OPUS_MT_EN_DE), bandwidth)
    return {"reference": reference, "new_tokens": args.new_tokens, "src_len": args.src_len,
            "geometry": OPUS_MT_EN_DE.to_dict(), "bound": bound, "memory": memory, "skipped": skipped, "rows": rows}


def run_corpus(args: argparse.Namespace, names: list[str], work: Path) -> dict[str, Any]:
    src, max_new = corpus(args.model, args.src, args.limit)
    files = convert(args.model, work, direct=True)
    engine_specs = specs(names, args.device, args.model, files, args.threads)
    probe = Job(src[:1], 1, 0, 2)
    rows, memory, skipped = with_workers(engine_specs, probe, lambda w: bench_corpus(w, src, max_new, args))
    reference = reference_engine(ran(rows))
    report(f"(b) {args.model} on {len(src)} sentences of {args.src}", rows, reference)
    memory_report(memory)
    return {"reference": reference, "model": str(args.model), "sentences": len(src), "max_new_tokens": max_new,
            "transformers_skipped": files.hf_refusal, "memory": memory, "skipped": skipped, "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--engines", default=None, help="comma-separated KIND or KIND-PRECISION names (kinds tolk, "
                   "transformers, ct2; e.g. tolk-bfloat16, ct2-int8_float16); default: "
                   + "; ".join(f"{d}: {','.join(e)}" for d, e in ENGINES.items()))
    p.add_argument("--benchmarks", default="forced,corpus", help="forced (a), corpus (b) or both")
    p.add_argument("--model", type=Path, default=Path("weights/en-pt"), help="(b)'s Tolk model directory")
    p.add_argument("--src", type=Path, default=Path("data/corpus/test.en"), help="(b)'s sentences")
    p.add_argument("--limit", type=int, default=0, help="(b): only the first N sentences (0 = all)")
    p.add_argument("--batches", default=None, help="comma-separated (default: 1,8,32; CUDA: 1,8,32,64)")
    p.add_argument("--beams", default="1,4", help="comma-separated beam sizes (1 = greedy)")
    p.add_argument("--new-tokens", type=int, default=64, help="(a)'s forced length")
    p.add_argument("--src-len", type=int, default=24, help="(a)'s source length, end-of-sentence included")
    p.add_argument("--repeats", type=int, default=3, help="(a): timed runs; (b): segments of the split")
    p.add_argument("--threads", type=int, default=2, help="torch threads; CTranslate2 intra_threads")
    p.add_argument("--quick", action="store_true", help="1 repeat, 16 new tokens, 32 sentences: checks the script")
    p.add_argument("--work", type=Path, default=None, help="keep the converted models here (default: a temp dir)")
    p.add_argument("--out", type=Path, default=None, help="JSON path, the PNG beside it (default: "
                   "bench/results/engines.json, CUDA: bench/results/engines-cuda.json; --quick: the temp dir)")
    p.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON at --out; run nothing")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.new_tokens, args.limit = 1, 16, args.limit or 32
    cuda = args.device == "cuda"
    stem = "engines-cuda" if cuda else "engines"
    out = args.out or (Path(tempfile.gettempdir()) / f"{stem}-quick.json" if args.quick
                       else Path(f"bench/results/{stem}.json"))
    if args.plot_only:
        plot(json.loads(out.read_text()), args, out)
        return
    args.batches = [int(b) for b in (args.batches or ("1,8,32,64" if cuda else "1,8,32")).split(",")]
    args.beams = [int(b) for b in args.beams.split(",")]
    names = [n for n in (args.engines or ",".join(ENGINES[args.device])).split(",") if n]
    try:
        precisions = {n: engine_kind(n, args.device)[1] for n in names}
    except ValueError as e:
        raise SystemExit(f"--engines: {e}") from None
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    torch.set_num_threads(args.threads)
    bandwidth = None if cuda else read_bandwidth_gbs()  # host memory: a CPU notion
    meta: dict[str, Any] = {**{pkg: version(pkg) for pkg in ("torch", "transformers", "ctranslate2")},
                            "threads": args.threads, "cpu": cpu_name()}
    if cuda:
        meta.update(device="cuda", gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda, precisions=precisions)
    else:
        meta["read_bandwidth_gbs"] = round(bandwidth or 0, 2)
        meta["cpu_flags"] = cpu_flags()
    if "corpus" in args.benchmarks and not args.src.is_file():
        raise SystemExit(f"--src {args.src}: no such file (the corpus benchmark's sentences)")
    results: dict[str, Any] = {"meta": {**meta, "quick": args.quick}}
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if "forced" in args.benchmarks:
            results["forced"] = run_forced(args, names, work, bandwidth)
            out.write_text(json.dumps(results, indent=2) + "\n")  # kept if the next benchmark fails
        if "corpus" in args.benchmarks:
            results["corpus"] = run_corpus(args, names, work)
    out.write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args, out)


def plot(results: dict[str, Any], args: argparse.Namespace, out: Path) -> None:
    try:
        from plots import throughput_plot  # matplotlib: kept out of the workers
    except ImportError as e:
        print(f"wrote {out}; no plot ({e})")
        return
    on = f" ({results['meta']['gpu']})" if "gpu" in results["meta"] else ""
    titles = {"forced": f"(a) random OPUS-MT en-de, forced length{on}",
              "corpus": f"(b) {args.model.name} test split{on}"}
    throughput_plot({titles[k]: results[k]["rows"] for k in titles if k in results}, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
