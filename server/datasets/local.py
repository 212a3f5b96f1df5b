"""A dataset job in this process: block after block, each read, translated by one engine, and written as a part.

Also the progress bar both runners move (rows, with sentences per second beside them).
"""

from __future__ import annotations

import logging
import resource
import time
from types import TracebackType
from typing import Any

from server.datasets.batches import BatchStats, Translate
from server.datasets.formats import read_block, write_part
from server.datasets.job import Job

log = logging.getLogger(__name__)


class Progress:
    """Rows done out of the job's rows, and the sentences per second of this run."""

    def __init__(self, job: Job, enabled: bool) -> None:
        from tqdm import tqdm

        total = sum(b.rows for b in job.blocks)
        done = total - sum(b.rows for b in job.remaining())
        self.bar = tqdm(total=total, initial=done, unit="rows", disable=not enabled, dynamic_ncols=True,
                        desc="translating", smoothing=0.1)
        self.started = time.time()
        self.ready: float | None = None  # when the first engine had its model (on Ray, after this run began)
        self.sentences = self.decoded = self.errors = 0

    def update(self, stats: BatchStats) -> None:
        if stats.ready is not None:
            self.ready = min(self.ready or stats.ready, stats.ready)
        self.sentences += stats.sentences
        self.decoded += stats.decoded
        self.errors += stats.errors
        rate = self.sentences / max(time.time() - self.started, 1e-9)
        self.bar.set_postfix_str(f"{rate:,.0f} sentences/s, {self.errors} errors", refresh=False)
        self.bar.update(stats.rows)

    def summary(self) -> dict[str, Any]:
        """What this run did, for the command's last line and the benchmarks."""
        now = time.time()
        seconds = now - self.started
        translating = now - max(self.ready or self.started, self.started)  # without Ray's actors loading the model
        return {"seconds": seconds, "sentences": self.sentences, "decoded": self.decoded, "errors": self.errors,
                "sentences_per_second": self.sentences / max(seconds, 1e-9), "translating_seconds": translating,
                "translating_per_second": self.sentences / max(translating, 1e-9),
                "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.bar.close()


def run_local(job: Job, translate: Translate, progress: Progress) -> None:
    """Translate the job's remaining blocks in order, one part each."""
    spec = job.spec
    for block in job.remaining():
        table = read_block(spec.format, job.files[block.file], block, spec.column, job.header)
        out, stats = translate.translate_table(table)
        write_part(spec.format, out, job.part(block), spec.column)
        progress.update(stats)
