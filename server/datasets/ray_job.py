"""A dataset job on a Ray cluster (Ray Data): the job's blocks read as Ray blocks, translated by a pool of actors.

`BlockSource` is a Ray Data datasource with one read task per remaining block of the job (the blocks the manifest
fixed, not Ray's own cut of the files, so that a restarted job finds the same ones). `map_batches` hands each
block whole to an actor of a fixed pool (`ActorPoolStrategy`); the actor holds one `Translate` (the model, loaded
once), translates the block and writes its part, atomically, as the local runner does; the driver reads back one
row of figures per block for the progress bar. Ray Data streams blocks to the actors as they free up, retries a
block whose actor died, and holds reads back while the actors are busy.

Every node must see INPUT, OUTPUT and the model directory at the same paths (a shared volume; deploy/ray/).
Each actor reserves `threads` CPUs (`num_cpus`), so Ray places at most cores / threads actors on a node and the
actors' torch threads never outnumber its cores.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray
from ray.data import ActorPoolStrategy
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from server.datasets.batches import BatchStats, Translate
from server.datasets.formats import Block, DatasetError, Format, InputFile, read_block, write_part
from server.datasets.job import Job
from server.datasets.local import Progress

log = logging.getLogger(__name__)

BLOCK = "__tolk_block"  # each row's block, from the read to the actor that writes the block's part


@dataclass(frozen=True)
class Parts:
    """What a read task and an actor need of the job: how to read its blocks and where their parts go."""

    format: Format
    column: str
    header: list[str] | None
    files: list[InputFile]
    blocks: dict[int, Block]
    paths: dict[int, str]  # by block, its part


def parts_of(job: Job, blocks: list[Block]) -> Parts:
    return Parts(job.spec.format, job.spec.column, job.header, job.files, {b.index: b for b in blocks},
                 {b.index: str(job.part(b)) for b in blocks})


class BlockSource(Datasource):
    """The job's remaining blocks as a Ray Data datasource, one read task (and one Ray block) each."""

    def __init__(self, parts: Parts) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.parts = parts

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        # One task per block whatever `parallelism` asks: a block is the unit a restart skips.
        return [ReadTask(partial(_read, self.parts, index),
                         BlockMetadata(num_rows=block.rows, size_bytes=None,
                                       input_files=(self.parts.files[block.file].path,), exec_stats=None))
                for index, block in self.parts.blocks.items()]


def _read(parts: Parts, index: int) -> Iterable[pa.Table]:
    block = parts.blocks[index]
    table = read_block(parts.format, parts.files[block.file], block, parts.column, parts.header)
    return [table.append_column(BLOCK, pa.array([index] * table.num_rows, pa.int64()))]


class TranslateBlocks:
    """An actor of the pool: `Translate` over whole blocks of the job, each written as its part."""

    def __init__(self, parts: Parts, translate: dict[str, Any]) -> None:
        self.parts = parts
        self.translate = Translate(**translate)

    def __call__(self, batch: pa.Table) -> pa.Table:
        figures: dict[str, list[Any]] = {"block": [], "rows": [], "sentences": [], "decoded": [], "errors": [],
                                         "ready": []}
        for index in pc.unique(batch.column(BLOCK)).to_pylist():
            rows = batch.filter(pc.equal(batch.column(BLOCK), index)).drop_columns([BLOCK])
            block = self.parts.blocks[index]
            if rows.num_rows != block.rows:  # Ray Data cut or merged a block: its part would be wrong
                raise DatasetError(f"block {index} reached its actor as {rows.num_rows} of its {block.rows} rows")
            out, stats = self.translate.translate_table(rows)
            write_part(self.parts.format, out, Path(self.parts.paths[index]), self.parts.column)
            for name, value in (("block", index), ("rows", stats.rows), ("sentences", stats.sentences),
                                ("decoded", stats.decoded), ("errors", stats.errors), ("ready", stats.ready)):
                figures[name].append(value)
        return pa.table(figures)


def connect(address: str) -> None:
    """Join the Ray cluster: `auto` is RAY_ADDRESS's, or one started on this machine, else a new local one."""
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # the job's bar says how it goes; errors still show
    if not ray.is_initialized():
        ray.init(address=None if address == "auto" else address, logging_level=logging.WARNING,
                 configure_logging=False)


def default_actors(threads: int, gpus: float) -> int:
    """As many actors as the cluster's CPUs hold at `threads` each (or its GPUs at `gpus` each)."""
    resources = ray.cluster_resources()  # type: ignore[no-untyped-call]
    if gpus:
        return max(1, int(resources.get("GPU", 0) // gpus))
    return max(1, int(resources.get("CPU", 1) // threads))


def run_ray(job: Job, translate: dict[str, Any], progress: Progress, actors: int | None, threads: int,
            gpus: float = 0.0) -> int:
    """Translate the job's remaining blocks on the connected Ray cluster; the number of actors used."""
    remaining = job.remaining()
    if not remaining:
        return 0
    size = min(actors or default_actors(threads, gpus), len(remaining))
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the job's own bar counts rows and sentences
    context.target_max_block_size = None  # never cut a block: it is written whole by the actor that has it
    log.info("translating %d blocks with %d actors of %d threads", len(remaining), size, threads)
    source = BlockSource(parts_of(job, remaining))
    # Reads take no CPU of their own: the actors hold every CPU they may (a read that waited for one would wait for
    # ever), and a read is little beside a translation; a few at a time keep the next blocks ready.
    dataset = ray.data.read_datasource(source, override_num_blocks=len(remaining), num_cpus=0,
                                       concurrency=2 * size).map_batches(
        TranslateBlocks, fn_constructor_kwargs={"parts": source.parts, "translate": {**translate, "threads": threads}},
        compute=ActorPoolStrategy(size=size), num_cpus=threads, num_gpus=gpus or None, batch_size=None,
        batch_format="pyarrow", zero_copy_batch=True)
    for figures in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
        for row in figures.to_pylist():
            progress.update(BatchStats(row["rows"], row["sentences"], row["decoded"], row["errors"], row["ready"]))
    return size
