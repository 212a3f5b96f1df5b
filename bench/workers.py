"""One engine per process: adapters for Tolk, transformers and CTranslate2, and the worker loop around them.

A worker loads one engine and answers jobs (sources as pieces, so each engine keeps its own numbering) with the
seconds its generate call took, the best hypotheses as pieces, its peak RSS (VmHWM, which a job may reset) and, on
CUDA, the peak of torch's allocator (None for CTranslate2, whose allocator torch cannot see). An engine is named
KIND or KIND-PRECISION (tolk-bfloat16, ct2-int8_float16); see engine_kind. A worker whose engine fails to load or
run answers with the error instead, so one missing library skips one engine, not the benchmark.
Competitors' libraries are imported only in their own workers. Used by bench/engines.py.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

import torch

from model import checkpoint, runtime
from model.decode import DecodeBatch
from model.generation import GenerationConfig
from model.marian_format import spm_pieces
from model.search import generate, release_batch

MAX_SOURCE_TOKENS = 256  # bench/engines.py cuts sources here, as model.evaluate does

ENGINES = {"cpu": ("tolk", "tolk-int8", "transformers", "ct2", "ct2-int8"),  # the default set of each device
           "cuda": ("tolk-float16", "tolk-bfloat16", "tolk", "ct2-float16", "ct2-int8_float16", "ct2", "transformers")}
# CTranslate2's compute types; which of them a device supports is checked when the worker loads
CT2_COMPUTE_TYPES = ("float32", "float16", "bfloat16", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16")
Pieces = list[list[str]]


def engine_kind(name: str, device: str) -> tuple[str, str]:
    """(kind, precision) of an engine name: KIND alone is float32, except transformers on CUDA (float16);
    KIND-PRECISION is a Tolk dtype, a CTranslate2 compute type or a transformers dtype. A name ending in "+jit"
    (tolk-int8+jit) runs in a process where numba's JIT compiles the kernels even where they were compiled ahead
    (model/native.py): the two side by side in one run."""
    kind, _, precision = name.removesuffix("+jit").partition("-")
    precision = precision or ("float16" if kind == "transformers" and device == "cuda" else "float32")
    allowed = {"tolk": checkpoint.PRECISIONS if device == "cpu" else tuple(checkpoint.DTYPES),
               "transformers": tuple(checkpoint.DTYPES), "ct2": CT2_COMPUTE_TYPES}
    if kind not in allowed:
        raise ValueError(f"engine {name!r}: the kind must be one of {tuple(allowed)}")
    if precision not in allowed[kind]:
        raise ValueError(f"engine {name!r}: {kind} on {device} takes {', '.join(allowed[kind])}")
    return kind, precision


class EngineFailed(RuntimeError):
    """A worker's engine could not load or run (a missing library, an unsupported precision on this device)."""


@dataclass(frozen=True)
class Job:
    """One engine call: translate these sources (pieces, end-of-sentence included) this way."""

    sources: Pieces
    beam: int
    min_new: int
    max_new: int


@dataclass(frozen=True)
class EngineSpec:
    """What a worker loads: an engine kind on one model's files."""

    name: str  # KIND or KIND-PRECISION (engine_kind)
    device: str  # cpu or cuda
    tolk_dir: Path
    hf_dir: Path | None  # export-marian's output (None: transformers cannot run this model)
    ct2_dir: Path
    suppress: tuple[str, ...]  # pieces CTranslate2 must never generate (Tolk forbids them itself)
    threads: int


class Engine(Protocol):
    def encode(self, sources: Pieces) -> Any: ...  # untimed: pieces -> the engine's input (on its device)
    def generate(self, inputs: Any, job: Job) -> Any: ...  # timed
    def decode(self, outputs: Any) -> Pieces: ...  # untimed: the best hypotheses, end-of-sentence excluded


def synchronize(device: str) -> None:
    """Wait for the GPU's queued work, so that the clock is read after it (torch's engines; CTranslate2 returns
    synchronously and never gets a torch CUDA context)."""
    if device == "cuda":
        torch.cuda.synchronize()


def piece_ids(pieces: list[str]) -> dict[str, int]:
    return {p: i for i, p in enumerate(pieces)}


class TolkEngine:
    """Tolk's offline engine (model.search.generate) in any of checkpoint.PRECISIONS, all sources of a job in one
    batch."""

    def __init__(self, spec: EngineSpec) -> None:
        torch.set_num_threads(spec.threads)
        self.device = spec.device
        # keep_modules=False: the weights once, in the network that decodes, as the server holds them; its heap too
        runtime.manage_heap()
        loaded = checkpoint.load(spec.tolk_dir, device=spec.device, dtype=engine_kind(spec.name, spec.device)[1],
                                 keep_modules=False)
        self.net = loaded.net
        self.source = piece_ids(loaded.tokenizer.vocab or spm_pieces(spec.tolk_dir / "source.spm"))
        self.target = loaded.tokenizer.vocab or spm_pieces(spec.tolk_dir / "target.spm")
        self.batches: list[DecodeBatch] = []  # on CUDA: kept with their recorded graphs, as the server keeps one

    def encode(self, sources: Pieces) -> list[list[int]]:
        return [[self.source[p] for p in s] for s in sources]

    def batch_for(self, rows: int, max_tgt: int) -> DecodeBatch | None:
        """On CUDA, a DecodeBatch replaying CUDA graphs that holds the job (made, and its graphs recorded, at the
        first job of a configuration: the untimed warm-up); None elsewhere (generate makes its own)."""
        if not self.device.startswith("cuda"):
            return None
        for batch in self.batches:
            if batch.cache.rows >= rows and batch.cache.max_tgt >= min(max_tgt, self.net.cfg.max_positions):
                return batch
        self.batches.append(DecodeBatch(self.net, rows, MAX_SOURCE_TOKENS, max_tgt, graphs=True))
        return self.batches[-1]

    def generate(self, inputs: list[list[int]], job: Job) -> list[list[int]]:
        # scores=False: CTranslate2's translate_batch computes no scores unless asked (return_scores), nor does
        # transformers' generate, so greedy rows skip the log-softmax here too (beam search needs it either way)
        config = GenerationConfig(beam_size=job.beam, min_new_tokens=job.min_new, max_new_tokens=job.max_new,
                                  scores=False)
        rows = len(inputs) * job.beam
        with torch.inference_mode():
            hyps = generate(self.net, inputs, config, max_rows=rows, batch=self.batch_for(rows, job.max_new))
        synchronize(self.device)
        return [h[0].tokens for h in hyps]

    def decode(self, outputs: list[list[int]]) -> Pieces:
        return [[self.target[i] for i in ids] for ids in outputs]


class TransformersEngine:
    """MarianMTModel.generate with export-marian's generation_config (which reproduces Tolk's decoding), except
    that forced end-of-sentence is off: the length comes from min/max_new_tokens, as in the other engines.
    Loaded in the name's dtype (float32 on the CPU, float16 on CUDA unless named)."""

    def __init__(self, spec: EngineSpec) -> None:
        import transformers  # bench extra

        if spec.hf_dir is None:
            raise ValueError("the transformers engine needs export-marian's output (hf_dir)")
        torch.set_num_threads(spec.threads)
        self.device = spec.device
        dtype = checkpoint.DTYPES[engine_kind(spec.name, spec.device)[1]]
        self.model = transformers.MarianMTModel.from_pretrained(spec.hf_dir, dtype=dtype).to(spec.device).eval()
        self.model.generation_config.update(forced_eos_token_id=None, max_length=None)  # generate() merges these
        self.source: dict[str, int] = json.loads((spec.hf_dir / "vocab.json").read_text(encoding="utf-8"))
        target = spec.hf_dir / "target_vocab.json"
        table = json.loads(target.read_text(encoding="utf-8")) if target.is_file() else self.source
        self.target = sorted(table, key=table.__getitem__)
        self.pad, self.eos = self.model.config.pad_token_id, self.model.config.eos_token_id

    def encode(self, sources: Pieces) -> torch.Tensor:
        S = max(len(s) for s in sources)
        ids = [[self.source[p] for p in s] + [self.pad] * (S - len(s)) for s in sources]
        return torch.tensor(ids, device=self.device)

    def generate(self, inputs: torch.Tensor, job: Job) -> torch.Tensor:
        with torch.inference_mode():
            out = self.model.generate(input_ids=inputs, attention_mask=inputs != self.pad, num_beams=job.beam,
                                      min_new_tokens=job.min_new, max_new_tokens=job.max_new)
        synchronize(self.device)
        return out

    def decode(self, outputs: torch.Tensor) -> Pieces:
        rows = [row[1:] for row in outputs.tolist()]  # drop the decoder start token
        return [[self.target[i] for i in row[: row.index(self.eos) if self.eos in row else len(row)]] for row in rows]


class CT2Engine:
    """A CTranslate2 Translator in the name's compute type (converted when loaded), one batch per job."""

    def __init__(self, spec: EngineSpec) -> None:
        import ctranslate2  # bench extra

        compute_type = engine_kind(spec.name, spec.device)[1]
        supported = ctranslate2.get_supported_compute_types(spec.device)
        if compute_type not in supported:
            raise ValueError(f"CTranslate2 on {spec.device} supports {sorted(supported)}, not {compute_type!r}")
        self.translator = ctranslate2.Translator(str(spec.ct2_dir), device=spec.device, compute_type=compute_type,
                                                 inter_threads=1, intra_threads=spec.threads)
        self.suppress = [[p] for p in spec.suppress] or None

    def encode(self, sources: Pieces) -> Pieces:
        return sources

    def generate(self, inputs: Pieces, job: Job) -> list[Any]:
        return list(self.translator.translate_batch(
            inputs, beam_size=job.beam, min_decoding_length=job.min_new, max_decoding_length=job.max_new,
            suppress_sequences=self.suppress, max_batch_size=0))

    def decode(self, outputs: list[Any]) -> Pieces:
        return [list(r.hypotheses[0]) for r in outputs]


def memory_mb(field: str) -> float:
    """VmRSS, or VmHWM (peak RSS since the last reset_peak), of this process (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to the current RSS (Linux 4.0+)


def gpu_peak_mb(kind: str, device: str, reset: bool) -> float | None:
    """Peak of torch's CUDA allocator since the last reset, for torch's engines on CUDA; else None."""
    if device != "cuda" or kind == "ct2":
        return None
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return torch.cuda.max_memory_allocated() / 2**20


@dataclass(frozen=True)
class Result:
    """One job's answer."""

    seconds: float  # the generate call alone
    outputs: Pieces
    peak_rss_mb: float  # VmHWM: host memory
    peak_gpu_mb: float | None  # torch.cuda.max_memory_allocated (torch's engines on CUDA only)


def answer(engine: Engine, job: Job, reset: bool, kind: str, device: str) -> Result:
    if reset:  # each configuration's peak from the memory the process holds, not what the last one freed
        if isinstance(engine, TolkEngine):  # nor the batch the last configuration's calls kept (`generate`)
            release_batch(engine.net)
        runtime.trim_heap()  # (glibc keeps freed heap: the server's scheduler trims it when idle, as here)
        reset_peak()
        gpu_peak_mb(kind, device, reset=True)
    inputs = engine.encode(job.sources)
    if kind != "ct2":
        synchronize(device)
    start = time.perf_counter()
    outputs = engine.generate(inputs, job)  # torch's engines synchronize before returning
    seconds = time.perf_counter() - start
    return Result(seconds, engine.decode(outputs), memory_mb("VmHWM"), gpu_peak_mb(kind, device, reset=False))


def serve(conn: Connection, spec: EngineSpec) -> None:
    """Worker process: load one engine, then answer (job, reset) with a Result (or the EngineFailed it raised)
    until None."""
    before = memory_mb("VmRSS")
    kinds: dict[str, Callable[[EngineSpec], Engine]] = {"tolk": TolkEngine, "transformers": TransformersEngine,
                                                         "ct2": CT2Engine}
    kind = engine_kind(spec.name, spec.device)[0]
    try:
        engine: Engine = kinds[kind](spec)
    except Exception as e:  # reported to the parent, which skips this engine
        conn.send(EngineFailed(f"{spec.name} failed to load on {spec.device}: {type(e).__name__}: {e}"))
        return
    conn.send((before, memory_mb("VmRSS"), memory_mb("VmHWM"),  # VmHWM: loading's peak (the imports' is lower)
               "numba" in sys.modules))  # False where the kernels were compiled ahead (model/native.py)
    while (request := conn.recv()) is not None:
        job, reset = request
        try:
            conn.send(answer(engine, job, reset, kind, spec.device))
        except Exception as e:  # a library loaded lazily (CTranslate2's cuBLAS) fails at the first job
            conn.send(EngineFailed(f"{spec.name} failed on {spec.device}: {type(e).__name__}: {e}"))
            return


class Worker:
    """The parent's end of one engine's process."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        ctx = mp.get_context("spawn")  # a fresh interpreter: no memory, threads or CUDA state from the parent
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=serve, args=(child, spec), daemon=True)
        saved = os.environ.get("TOLK_KERNELS")
        if spec.name.endswith("+jit"):  # the child starts with the parent's environment
            os.environ["TOLK_KERNELS"] = "jit"
        try:
            self.process.start()
        finally:
            if saved is None:
                os.environ.pop("TOLK_KERNELS", None)
            else:
                os.environ["TOLK_KERNELS"] = saved
        self.before_load_mb, self.loaded_mb, self.load_peak_mb, self.numba = self.receive()

    def receive(self) -> Any:
        """The worker's next answer; EngineFailed when it reports one or dies without answering."""
        try:
            message = self.conn.recv()
        except EOFError:
            self.process.join(5)
            raise EngineFailed(f"{self.spec.name}'s worker exited with {self.process.exitcode}") from None
        if isinstance(message, EngineFailed):
            raise message
        return message

    def run(self, job: Job, reset: bool = False) -> Result:
        self.conn.send((job, reset))
        result: Result = self.receive()
        return result

    def close(self) -> None:
        if self.process.is_alive():
            with contextlib.suppress(OSError):  # a worker that failed closes its end
                self.conn.send(None)
        self.process.join(30)
