"""One engine per process: adapters for Tolk, transformers and CTranslate2, and the worker loop around them.

A worker loads one engine and answers jobs (sources as pieces, so each engine keeps its own numbering) with the
seconds its generate call took, the best hypotheses as pieces and its peak RSS (VmHWM, which a job may reset).
Competitors' libraries are imported only in their own workers. Used by bench/engines.py.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

import torch

from model import checkpoint
from model.generation import GenerationConfig
from model.marian_format import spm_pieces
from model.search import generate

ENGINES = ("tolk", "tolk-int8", "transformers", "ct2", "ct2-int8")
Pieces = list[list[str]]


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

    name: str  # one of ENGINES
    tolk_dir: Path
    hf_dir: Path | None  # export-marian's output (None: transformers cannot run this model)
    ct2_dir: Path
    suppress: tuple[str, ...]  # pieces CTranslate2 must never generate (Tolk forbids them itself)
    threads: int


class Engine(Protocol):
    def encode(self, sources: Pieces) -> Any: ...  # untimed: pieces -> the engine's input
    def generate(self, inputs: Any, job: Job) -> Any: ...  # timed
    def decode(self, outputs: Any) -> Pieces: ...  # untimed: the best hypotheses, end-of-sentence excluded


def piece_ids(pieces: list[str]) -> dict[str, int]:
    return {p: i for i, p in enumerate(pieces)}


class TolkEngine:
    """Tolk's offline engine (model.search.generate), float32 or int8, all sources of a job in one batch."""

    def __init__(self, spec: EngineSpec) -> None:
        torch.set_num_threads(spec.threads)
        precision = "int8" if spec.name.endswith("int8") else "float32"
        loaded = checkpoint.load(spec.tolk_dir, device="cpu", dtype=precision)
        self.net = loaded.net
        self.source = piece_ids(loaded.tokenizer.vocab or spm_pieces(spec.tolk_dir / "source.spm"))
        self.target = loaded.tokenizer.vocab or spm_pieces(spec.tolk_dir / "target.spm")

    def encode(self, sources: Pieces) -> list[list[int]]:
        return [[self.source[p] for p in s] for s in sources]

    def generate(self, inputs: list[list[int]], job: Job) -> list[list[int]]:
        config = GenerationConfig(beam_size=job.beam, min_new_tokens=job.min_new, max_new_tokens=job.max_new)
        with torch.inference_mode():
            return [h[0].tokens for h in generate(self.net, inputs, config, max_rows=len(inputs) * job.beam)]

    def decode(self, outputs: list[list[int]]) -> Pieces:
        return [[self.target[i] for i in ids] for ids in outputs]


class TransformersEngine:
    """MarianMTModel.generate with export-marian's generation_config (which reproduces Tolk's decoding), except
    that forced end-of-sentence is off: the length comes from min/max_new_tokens, as in the other engines."""

    def __init__(self, spec: EngineSpec) -> None:
        import transformers  # bench extra

        if spec.hf_dir is None:
            raise ValueError("the transformers engine needs export-marian's output (hf_dir)")
        torch.set_num_threads(spec.threads)
        self.model = transformers.MarianMTModel.from_pretrained(spec.hf_dir).eval()
        self.model.generation_config.update(forced_eos_token_id=None, max_length=None)  # generate() merges these
        self.source: dict[str, int] = json.loads((spec.hf_dir / "vocab.json").read_text(encoding="utf-8"))
        target = spec.hf_dir / "target_vocab.json"
        table = json.loads(target.read_text(encoding="utf-8")) if target.is_file() else self.source
        self.target = sorted(table, key=table.__getitem__)
        self.pad, self.eos = self.model.config.pad_token_id, self.model.config.eos_token_id

    def encode(self, sources: Pieces) -> torch.Tensor:
        S = max(len(s) for s in sources)
        return torch.tensor([[self.source[p] for p in s] + [self.pad] * (S - len(s)) for s in sources])

    def generate(self, inputs: torch.Tensor, job: Job) -> torch.Tensor:
        with torch.inference_mode():
            return self.model.generate(input_ids=inputs, attention_mask=inputs != self.pad, num_beams=job.beam,
                                       min_new_tokens=job.min_new, max_new_tokens=job.max_new)

    def decode(self, outputs: torch.Tensor) -> Pieces:
        rows = [row[1:] for row in outputs.tolist()]  # drop the decoder start token
        return [[self.target[i] for i in row[: row.index(self.eos) if self.eos in row else len(row)]] for row in rows]


class CT2Engine:
    """A CTranslate2 Translator, float32 or int8 (quantized when loaded), one batch per job."""

    def __init__(self, spec: EngineSpec) -> None:
        import ctranslate2  # bench extra

        compute_type = "int8" if spec.name.endswith("int8") else "float32"
        self.translator = ctranslate2.Translator(str(spec.ct2_dir), device="cpu", compute_type=compute_type,
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


def serve(conn: Connection, spec: EngineSpec) -> None:
    """Worker process: load one engine, then answer (job, reset) with (seconds, outputs, peak MB) until None."""
    before = memory_mb("VmRSS")
    kinds: dict[str, Callable[[EngineSpec], Engine]] = {"tolk": TolkEngine, "transformers": TransformersEngine,
                                                         "ct2": CT2Engine}
    engine: Engine = kinds[spec.name.split("-")[0]](spec)
    conn.send((before, memory_mb("VmRSS")))
    while (request := conn.recv()) is not None:
        job, reset = request
        if reset:
            reset_peak()
        inputs = engine.encode(job.sources)
        start = time.perf_counter()
        outputs = engine.generate(inputs, job)
        seconds = time.perf_counter() - start
        conn.send((seconds, engine.decode(outputs), memory_mb("VmHWM")))


class Worker:
    """The parent's end of one engine's process."""

    def __init__(self, spec: EngineSpec) -> None:
        ctx = mp.get_context("spawn")  # a fresh interpreter: no memory or threads inherited from the parent
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=serve, args=(child, spec), daemon=True)
        self.process.start()
        self.before_load_mb, self.loaded_mb = self.conn.recv()

    def run(self, job: Job, reset: bool = False) -> tuple[float, Pieces, float]:
        self.conn.send((job, reset))
        seconds, outputs, peak = self.conn.recv()
        return seconds, outputs, peak

    def close(self) -> None:
        if self.process.is_alive():
            self.conn.send(None)
        self.process.join(30)
