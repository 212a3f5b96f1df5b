"""Serving benchmark: the real server (uvicorn on loopback) under 1..64 concurrent clients, batched vs unbatched.

Starts two servers on the same model directory, one with continuous batching and one decoding one sentence at a
time (as LibreTranslate serves), and drives them in turn (alternating, per client count) with closed-loop clients
that each send one sentence per request. Reports sentences/s, generated tokens/s, p50/p99 latency and, from a
streamed pass, time to first token; and the engine's own offline throughput (model.search.generate, batch of
`--rows`) on the same sentences. Prints a table and writes JSON. Never run by the test suite.

    python bench/serve.py --model weights/en-pt
    python bench/serve.py --random 512x6x8000       # a random OPUS-MT-geometry model (forced-length outputs)
    python bench/serve.py --tiny --clients 1 8      # the tiny test model, small scale
    python bench/serve.py --tiny --clients 1 4 --quick   # a dry run of the script (about a minute)
    python bench/serve.py --model weights/en-pt --sentences data/corpus/test.en --device cuda --dtype float16 \
        --clients 1 8 32 64 --rows 128                # on a GPU
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from int8_products import cpu_flags  # noqa: E402  (bench/, this script's folder)

from model.checkpoint import LoadedModel, ModelInfo, load, save  # noqa: E402
from model.config import ModelConfig  # noqa: E402
from model.search import generate  # noqa: E402
from model.transformer import Transformer  # noqa: E402

SYLLABLES = [c + v for c in "bcdfghjklmnprstvz" for v in "aeiou"] + ["an", "en", "in", "or", "ul", "est"]


def synthetic_sentences(n: int, seed: int = 0) -> list[str]:
    """Sentences of made-up words (5 to 20 words), varied enough for an 8,000-piece SentencePiece model."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(6000)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 20))).capitalize() + "." for _ in range(n)]


def random_model_dir(directory: Path, geometry: str) -> Path:
    """A randomly initialised model: WIDTHxLAYERSxVOCAB (e.g. 512x6x8000, 8 heads, feed-forward 4x width)."""
    import sentencepiece as spm

    width, layers, vocab = (int(x) for x in geometry.split("x"))
    if (directory / "config.json").exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    corpus = directory / "corpus.txt"
    corpus.write_text("\n".join(synthetic_sentences(30000, seed=1)) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(directory / "spm"), vocab_size=vocab, model_type="unigram",
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, byte_fallback=True, hard_vocab_limit=False, minloglevel=2,
    )
    size = spm.SentencePieceProcessor(model_file=str(directory / "spm.model")).get_piece_size()
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab_size=size, tgt_vocab_size=size, d_model=width, n_heads=max(1, width // 64),
                      encoder_layers=layers, decoder_layers=layers, d_ff=4 * width, dropout=0.0)
    spm_path = directory / "spm.model"
    save(directory, Transformer(cfg).eval(), ModelInfo(f"random-{geometry}", "en", "pt"), spm_path, spm_path)
    return directory


def start_server(model_dir: Path, port: int, batching: bool, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TOLK_MAX_BATCH_ROWS": str(args.rows), "TOLK_MAX_QUEUE": "100000",
           "TOLK_REQUEST_TIMEOUT": "600", "TOLK_MAX_NEW_TOKENS": str(max(args.max_new_tokens, 1)),
           "TOLK_DTYPE": args.dtype,
           "TOLK_TRANSLATION_CACHE_ENTRIES": "0"}  # every request decodes: this measures the engine and the server
    command = [sys.executable, "-m", "server", "--model", str(model_dir), "--port", str(port), "--device",
               args.device, "--threads", str(args.threads), "--log-level", "warning"]
    if not batching:
        command.append("--no-batching")
    return subprocess.Popen(command, cwd=ROOT, env=env)


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server on {url} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:  # refused while starting, or 503 (HTTPError) until the model is loaded
            pass
        time.sleep(0.3)
    raise SystemExit(f"server on {url} not ready after {timeout} s")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_request(session: aiohttp.ClientSession, url: str, text: str, options: dict[str, Any],
                      stream: bool) -> tuple[float, float | None, int]:
    """(latency, time to first token or None, generated tokens or 0 where the answer does not say) of one request.

    Plain requests ask for no scores, as LibreTranslate's clients do (with `return_scores` the server takes the
    general path of the decode step, which computes log-probabilities); their tokens are counted from /metrics."""
    body = {"q": text, "source": "en", "target": "pt", "options": options}
    start = time.perf_counter()
    if not stream:
        async with session.post(f"{url}/translate", json=body) as r:
            r.raise_for_status()
            await r.read()
        return time.perf_counter() - start, None, 0
    first: float | None = None
    tokens = 0
    async with session.post(f"{url}/translate/stream", json=body) as r:
        r.raise_for_status()
        event = ""
        async for raw in r.content:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("event: "):
                event = line[7:]
                if event == "token" and first is None:
                    first = time.perf_counter() - start
            elif line.startswith("data: ") and event == "done":
                tokens = int(json.loads(line[6:])["generated_tokens"])
            elif line.startswith("data: ") and event == "error":
                raise RuntimeError(line)
    return time.perf_counter() - start, first, tokens


async def generated_total(session: aiohttp.ClientSession, url: str) -> float:
    """Tokens the server has generated so far (`tolk_generated_tokens_total`, every model and reason)."""
    async with session.get(f"{url}/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("tolk_generated_tokens_total{"))


async def drive(url: str, sentences: list[str], clients: int, requests: int, options: dict[str, Any],
                stream: bool) -> dict[str, Any]:
    """Closed loop: `clients` tasks each send their next sentence as soon as the previous answer arrives.

    The load generator is aiohttp (0.3-0.7 ms of CPU per request here, httpx 1.4-2.8 ms): it shares the machine
    with the server, so its CPU time per request is reported too.
    """
    queue = iter(range(requests))
    latencies: list[float] = []
    ttfts: list[float] = []
    tokens = 0

    async def client_loop(session: aiohttp.ClientSession) -> None:
        nonlocal tokens
        for i in queue:
            latency, ttft, n = await one_request(session, url, sentences[i % len(sentences)], options, stream)
            latencies.append(latency)
            tokens += n
            if ttft is not None:
                ttfts.append(ttft)

    connector = aiohttp.TCPConnector(limit=clients + 4)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        before = await generated_total(session, url)
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(client_loop(session) for _ in range(clients)))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        if not stream:
            tokens = int(await generated_total(session, url) - before)
    return {
        "requests": requests, "seconds": elapsed, "sentences_per_s": requests / elapsed,
        "tokens_per_s": tokens / elapsed, "generated_tokens": tokens,
        "latency_p50_ms": 1000 * percentile(latencies, 0.5), "latency_p99_ms": 1000 * percentile(latencies, 0.99),
        "ttft_p50_ms": 1000 * percentile(ttfts, 0.5) if ttfts else None,
        "ttft_p99_ms": 1000 * percentile(ttfts, 0.99) if ttfts else None,
        "client_cpu_ms_per_request": 1000 * cpu / requests,
    }


def offline(loaded: LoadedModel, sentences: list[str], args: argparse.Namespace, rows: int) -> dict[str, Any]:
    """The engine alone: model.search.generate over the sentences with `rows` decoding together (best of 2)."""
    config = loaded.generation.update(max_new_tokens=args.max_new_tokens, scores=False)  # as the plain requests
    sources = [loaded.tokenizer.encode(s) for s in sentences]
    generate(loaded.net, sources[:rows], config, max_rows=rows)  # warm-up
    best: dict[str, Any] = {}
    for _ in range(2):
        synchronize(loaded.device)
        start = time.perf_counter()
        hyps = generate(loaded.net, sources, config, max_rows=rows)
        synchronize(loaded.device)
        elapsed = time.perf_counter() - start
        tokens = sum(len(h[0].tokens) for h in hyps)
        if not best or elapsed < best["seconds"]:
            best = {"sentences": len(sources), "seconds": elapsed, "sentences_per_s": len(sources) / elapsed,
                    "tokens_per_s": tokens / elapsed, "rows": rows}
    return best


def ct2_offline(model_dir: Path, sentences: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """CTranslate2's `translate_batch` on the same weights (bench/ct2_convert.py), precision and sentences, offline:
    the median time of one sentence at a time on one thread, and sentences/s in batches of 32 on two threads, the
    reference points of the engine-speed goals. Tokenizing is left out of CTranslate2's time (it is in the server's)."""
    import ctranslate2
    from ct2_convert import TolkConverter, banned_pieces

    from model.marian_format import spm_pieces

    ct2_dir = args.work / f"{model_dir.name}-ct2"
    TolkConverter(model_dir).convert(str(ct2_dir), force=True)
    loaded = load(model_dir, device="cpu")
    pieces = loaded.tokenizer.vocab or spm_pieces(model_dir / "source.spm")
    sources = [[pieces[i] for i in loaded.tokenizer.encode(s)] for s in sentences]
    suppress = [[p] for p in banned_pieces(model_dir)] or None
    compute_type = "int8" if args.dtype == "int8" else "float32"
    result: dict[str, Any] = {"compute_type": compute_type, "version": ctranslate2.__version__}
    for threads, batch in ((1, 1), (2, 32)):
        translator = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type=compute_type,
                                            inter_threads=1, intra_threads=threads)
        options = {"beam_size": 1, "max_decoding_length": args.max_new_tokens, "suppress_sequences": suppress}
        translator.translate_batch(sources[:batch], **options)  # warm-up
        times = []
        start = time.perf_counter()
        for i in range(0, len(sources), batch):
            t = time.perf_counter()
            translator.translate_batch(sources[i: i + batch], **options, max_batch_size=0)
            times.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - start
        if batch == 1:
            result["one_at_a_time_p50_ms"] = 1000 * percentile(times, 0.5)
        else:
            result["batch32_sentences_per_s"] = len(sources) / elapsed
        del translator
    return result


def synchronize(device: torch.device) -> None:
    """Let queued GPU work finish before the clock is read."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def print_table(rows: list[dict[str, Any]]) -> None:
    head = f"{'clients':>7} {'server':>9} {'stream':>6} {'req':>5} {'sent/s':>8} {'tok/s':>8} {'p50 ms':>8} " \
           f"{'p99 ms':>8} {'ttft50':>7} {'ttft99':>7} {'cli ms':>6}"
    print(head)
    print("-" * len(head))
    for r in rows:
        ttft50 = f"{r['ttft_p50_ms']:7.0f}" if r["ttft_p50_ms"] is not None else f"{'-':>7}"
        ttft99 = f"{r['ttft_p99_ms']:7.0f}" if r["ttft_p99_ms"] is not None else f"{'-':>7}"
        print(f"{r['clients']:>7} {r['server']:>9} {str(r['stream']):>6} {r['requests']:>5} "
              f"{r['sentences_per_s']:8.2f} {r['tokens_per_s']:8.1f} {r['latency_p50_ms']:8.0f} "
              f"{r['latency_p99_ms']:8.0f} {ttft50} {ttft99} {r['client_cpu_ms_per_request']:6.2f}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="a model directory")
    source.add_argument("--random", metavar="WxLxV", help="a random model of this geometry, e.g. 512x6x8000")
    source.add_argument("--tiny", action="store_true", help="the tiny test model (tests/tiny.py)")
    p.add_argument("--sentences", type=Path, help="real sentences, one per line (e.g. data/corpus/test.en)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--requests", type=int, default=0, help="requests per phase (default: max(32, 2 x clients))")
    p.add_argument("--stream-requests", type=int, default=0,
                   help="streamed requests per phase (default: max(16, clients))")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--rows", type=int, default=32, help="cache rows of the batched server and of the offline run")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16", "int8", "float16w"],
                   help="of the servers and of the offline run")
    p.add_argument("--ct2", action="store_true",
                   help="also CTranslate2 offline on the same weights and sentences (one at a time, 1 thread; "
                        "batches of 32, 2 threads), and the server's ratios to it")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "tolk-bench")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "serve.json")
    p.add_argument("--quick", action="store_true", help="checks the script: 16 requests and 8 streamed per phase "
                   "(unless given), 16 new tokens, offline runs on 32 sentences; writes to the temp dir unless --out")
    args = p.parse_args()
    if args.quick:
        args.requests, args.stream_requests = args.requests or 16, args.stream_requests or 8
        args.max_new_tokens = 16
        if args.out == p.get_default("out"):
            args.out = Path(tempfile.gettempdir()) / "serve-quick.json"
    return args


def model_directory(args: argparse.Namespace) -> Path:
    if args.model:
        return Path(args.model)
    if args.random:
        return random_model_dir(args.work / f"random-{args.random}", args.random)
    from tests.tiny import make_model_dir

    directory = args.work / "tiny"
    return directory if (directory / "config.json").exists() else make_model_dir(directory)


def run_phases(urls: dict[str, str], sentences: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    options = {"max_new_tokens": args.max_new_tokens}
    rows: list[dict[str, Any]] = []
    for clients in args.clients:
        requests = args.requests or max(32, 2 * clients)
        for stream, n in ((False, requests), (True, args.stream_requests or max(16, clients))):
            for server, url in urls.items():  # alternate the two servers at every step
                asyncio.run(drive(url, sentences, min(clients, 4), min(clients, 4), options, stream))  # warm-up
                result = asyncio.run(drive(url, sentences, clients, n, options, stream))
                rows.append({"clients": clients, "server": server, "stream": stream, **result})
                print_table(rows[-1:])
    return rows


def machine(loaded: LoadedModel) -> dict[str, Any]:
    facts: dict[str, Any] = {"cpu": platform.processor() or platform.machine(), "flags": cpu_flags(),
                             "cores": os.cpu_count(), "torch": torch.__version__}
    if loaded.device.type == "cuda":
        facts.update(gpu=torch.cuda.get_device_name(loaded.device), cuda=torch.version.cuda)
    return facts


def main() -> int:
    args = parse_args()
    model_dir = model_directory(args)
    if args.sentences:
        sentences = args.sentences.read_text(encoding="utf-8").splitlines()[:512]
    elif args.tiny:
        from tests.tiny import corpus_lines

        sentences = corpus_lines(512, seed=2)
    else:
        sentences = synthetic_sentences(512, seed=2)
    urls = {"batched": f"http://127.0.0.1:{args.port}", "unbatched": f"http://127.0.0.1:{args.port + 1}"}
    servers = [start_server(model_dir, args.port, True, args), start_server(model_dir, args.port + 1, False, args)]
    try:
        for url, process in zip(urls.values(), servers, strict=True):
            wait_ready(url, process)
        rows = run_phases(urls, sentences, args)
    finally:
        for process in servers:
            process.terminate()
            process.wait(30)
    torch.set_num_threads(args.threads)
    loaded = load(model_dir, device=args.device, dtype=args.dtype)
    reference = offline(loaded, sentences[: 32 if args.quick else max(args.rows * 4, 128)], args, args.rows)
    # One row at a time is the unbatched server's engine: batched/unbatched cannot exceed this pair's ratio.
    single = offline(loaded, sentences[: 32 if args.quick else 128], args, 1)
    ceiling = reference["tokens_per_s"] / single["tokens_per_s"]
    for r in (reference, single):
        print(f"offline engine, {r['rows']:>2} rows: {r['sentences_per_s']:.2f} sentences/s, "
              f"{r['tokens_per_s']:.1f} tokens/s")
    print(f"the engine's own {args.rows}-row / 1-row ratio: {ceiling:.2f}x (tokens/s)\n")
    print_table(rows)
    summary: dict[str, Any] = {}
    for clients in args.clients:
        json_rows = {r["server"]: r for r in rows if r["clients"] == clients and not r["stream"]}
        summary[str(clients)] = {
            "speedup_vs_unbatched": json_rows["batched"]["tokens_per_s"] / json_rows["unbatched"]["tokens_per_s"],
            "fraction_of_offline": json_rows["batched"]["tokens_per_s"] / reference["tokens_per_s"],
        }
        print(f"{clients:>3} clients: batched/unbatched {summary[str(clients)]['speedup_vs_unbatched']:.2f}x, "
              f"batched/offline {summary[str(clients)]['fraction_of_offline']:.0%} (tokens/s)")
    measured = max(r["requests"] for r in rows if not r["stream"])  # the sentences the plain phases sent
    ct2 = ct2_offline(model_dir, sentences[:measured], args) if args.ct2 else None
    if ct2 is not None:
        one = next(r for r in rows if r["clients"] == 1 and r["server"] == "batched" and not r["stream"])
        print(f"\nCTranslate2 {ct2['version']} {ct2['compute_type']} offline: one sentence at a time (1 thread) "
              f"{ct2['one_at_a_time_p50_ms']:.1f} ms median; batches of 32 (2 threads) "
              f"{ct2['batch32_sentences_per_s']:.1f} sentences/s")
        print(f"  the server, 1 client: {one['latency_p50_ms']:.1f} ms median "
              f"({one['latency_p50_ms'] - ct2['one_at_a_time_p50_ms']:+.1f} ms against CTranslate2)")
        for clients in args.clients:
            r = next(r for r in rows if r["clients"] == clients and r["server"] == "batched" and not r["stream"])
            ct2[f"server_{clients}_clients_ratio"] = r["sentences_per_s"] / ct2["batch32_sentences_per_s"]
            print(f"  the server, {clients} clients: {r['sentences_per_s']:.1f} sentences/s, "
                  f"{ct2[f'server_{clients}_clients_ratio']:.2f}x CTranslate2's batches of 32")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "model": str(model_dir), "device": args.device, "dtype": args.dtype, "threads": args.threads, "rows": args.rows,
        "max_new_tokens": args.max_new_tokens, "machine": machine(loaded), "quick": args.quick,
        "offline": reference, "offline_one_row": single, "batching_ceiling": ceiling, "phases": rows,
        "summary": summary, "ct2": ct2,
    }, indent=2) + "\n")
    try:
        from plots import load_plot  # matplotlib, bench extra
    except ImportError as e:
        print(f"wrote {args.out}; no plot ({e})")
        return 0
    load_plot(rows, args.out.stem, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
