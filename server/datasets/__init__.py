"""Whole datasets translated: `tolk translate-dataset`, in one process or on a Ray cluster, resumable.

`formats` reads and writes Parquet, JSON Lines and CSV in blocks of rows; `job` plans the blocks and keeps the
manifest that lets a killed job resume; `engine` translates a window of texts; `batches.Translate` is the callable
class for Ray Data's `map_batches` (also in a pipeline of one's own: docs/bulk.md); `local` and `ray_job` run a job;
`command` is the console command. `from server.datasets import Translate` imports the class when it is first used.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Translate":  # imported on first use: the `tolk` parser imports this package to build its arguments
        from server.datasets.batches import Translate

        return Translate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
