"""`Translate`: a callable class for Ray Data's `map_batches`, which `tolk translate-dataset --ray` runs too.

Ray Data makes one instance per actor of a pool (`compute=ray.data.ActorPoolStrategy(size=n)`), so each actor
loads the model once and then translates batch after batch. The class needs nothing of Ray itself: it maps a
batch (a pyarrow Table, or the dict of numpy arrays that is Ray Data's default batch format) to the same batch
with a translation column and an error column added. docs/bulk.md shows it in a pipeline of one's own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from server.datasets.engine import Engine, EngineOptions
from server.datasets.formats import PRESET, is_text


@dataclass(frozen=True)
class BatchStats:
    rows: int
    sentences: int
    decoded: int
    errors: int
    ready: float | None = None  # time.time() when the engine that translated it had loaded its model


class Translate:
    """Translate one column of each batch; every other column is kept, and the rows' order.

    `model`: a model directory; `column`: the text to translate; `output_column` (default `<column>_<target>`)
    and `error_column` (default `<output_column>_error`, null where the row translated) are added. `threads`:
    torch threads of this process (it sets them: reserve as many CPUs for the actor, `num_cpus=threads`).
    `generation`: changes to the model's generation defaults (e.g. `{"beam_size": 4}`); `cache_url`: the servers'
    Redis translation cache.
    """

    def __init__(self, model: str | Path, column: str, source: str, target: str, *, output_column: str | None = None,
                 error_column: str | None = None, threads: int = 1, dtype: str = "float32", device: str = "cpu",
                 rows: int = 64, generation: dict[str, Any] | None = None, max_source_tokens: int | None = None,
                 cache_url: str | None = None) -> None:
        import torch

        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)  # an actor's process is the job's: no more threads than the CPUs Ray gave it
        self.column = column
        self.output_column = output_column or f"{column}_{target}"
        self.error_column = error_column or f"{self.output_column}_error"
        self.engine = Engine(EngineOptions(Path(model), source, target, dtype=dtype, device=device, rows=rows,
                                           generation=dict(generation or {}), max_source_tokens=max_source_tokens,
                                           cache_url=cache_url))
        self.ready = time.time()

    def __call__(self, batch: pa.Table | dict[str, np.ndarray]) -> pa.Table | dict[str, np.ndarray]:
        """The batch with its translations and errors added, in the batch's own format."""
        if isinstance(batch, pa.Table):
            return self.translate_table(batch)[0]
        table, _ = self.translate_table(pa.table({k: _arrow(v) for k, v in batch.items()}))
        return {**batch, **{n: np.array(table.column(n).to_pylist(), dtype=object)
                            for n in (self.output_column, self.error_column)}}

    def translate_table(self, table: pa.Table) -> tuple[pa.Table, BatchStats]:
        """The table with the two columns added (a reader's errors, `formats.PRESET`, carried into the error
        column), and what translating it took."""
        if self.column not in table.column_names:
            raise KeyError(f"the batch has no column {self.column!r}; it has {', '.join(table.column_names)}")
        for name in (self.output_column, self.error_column):
            if name in table.column_names:
                raise ValueError(f"the batch already has a column {name!r}; choose another output column")
        kind = table.schema.field(self.column).type
        if not is_text(kind):
            raise TypeError(f"column {self.column!r} holds {kind} values, not text")
        texts = table.column(self.column).to_pylist()
        preset = table.column(PRESET).to_pylist() if PRESET in table.column_names else [None] * len(texts)
        done = self.engine.translate([None if p else t for t, p in zip(texts, preset, strict=True)])
        errors = [p or e for p, e in zip(preset, done.errors, strict=True)]
        if PRESET in table.column_names:
            table = table.drop_columns([PRESET])
        table = table.append_column(pa.field(self.output_column, pa.string()), pa.array(done.translations, pa.string()))
        table = table.append_column(pa.field(self.error_column, pa.string()), pa.array(errors, pa.string()))
        return table, BatchStats(len(texts), done.sentences, done.decoded, sum(e is not None for e in errors),
                                 self.ready)


def _arrow(values: np.ndarray) -> pa.Array:
    """A numpy column of a Ray Data batch as Arrow (an object column of str and None as strings)."""
    if values.dtype == object:
        return pa.array(list(values), from_pandas=True)
    return pa.array(values)
