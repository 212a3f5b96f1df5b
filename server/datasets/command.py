"""`tolk translate-dataset INPUT OUTPUT --column TEXT --source S --target T [--ray auto|ADDRESS]`.

Reads its arguments, plans or resumes the job (`server.datasets.job`), and runs it here or on Ray. Imports stay
inside `main`: the `tolk` parser imports this module to build its arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from server.datasets.job import Job
    from server.datasets.local import Progress

log = logging.getLogger(__name__)

DEFAULT_BLOCK_ROWS = 2000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", type=Path, metavar="INPUT",
                        help="a Parquet, JSON Lines or CSV file, or a directory of such files (read in name order)")
    parser.add_argument("output", type=Path, metavar="OUTPUT",
                        help="a file of the input's format (its parts are joined at the end), or a directory of "
                             "parts; the same OUTPUT again resumes the job")
    parser.add_argument("--column", required=True, metavar="TEXT", help="the column to translate")
    parser.add_argument("--source", required=True, help="the text's language code")
    parser.add_argument("--target", required=True, help="the language code to translate into")
    parser.add_argument("--model", type=Path, metavar="DIR",
                        help="model directory (default: the one under weights/ or TOLK_MODELS for the pair)")
    parser.add_argument("--output-column", metavar="NAME", help="where translations go (default: <column>_<target>)")
    parser.add_argument("--error-column", metavar="NAME",
                        help="where a row's error goes, null if none (default: <output column>_error)")
    parser.add_argument("--format", choices=["parquet", "jsonl", "csv"], help="default: from the file extensions")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16", "int8"],
                        help="auto: as the server, int8 on the CPU and float32 on a GPU")
    parser.add_argument("--beam-size", type=int)
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--block-rows", type=int, default=DEFAULT_BLOCK_ROWS,
                        help="rows per block: what a restart redoes at most, and the window sorted and deduplicated "
                             "together (default: %(default)s)")
    parser.add_argument("--rows", type=int, default=64, help="sentences decoding together (default: %(default)s)")
    parser.add_argument("--threads", type=int,
                        help="torch threads (default: every core); with --ray, threads per actor (default: 1)")
    parser.add_argument("--ray", metavar="auto|ADDRESS",
                        help="run on Ray: auto joins RAY_ADDRESS's cluster or one started here, else starts a local "
                             "one; or a cluster's address")
    parser.add_argument("--actors", type=int, help="with --ray: actors in the pool (default: CPUs / threads)")
    parser.add_argument("--gpus-per-actor", type=float, default=0.0, help="with --ray: GPUs each actor reserves")
    parser.add_argument("--cache-url", metavar="URL",
                        help="the servers' Redis translation cache, shared with this job (default: TOLK_CACHE_URL)")
    parser.add_argument("--report", type=Path, metavar="FILE", help="write this run's figures as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    """Run the job; 1 with a message naming the problem if it cannot."""
    from server.datasets.formats import DatasetError

    try:
        return _run(args)
    except (DatasetError, ValueError) as exc:
        print(f"tolk translate-dataset: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    from model.checkpoint import read_meta, resolve_device
    from server.datasets.engine import generation_config, language_prefix
    from server.datasets.formats import input_files
    from server.datasets.job import JobSpec, open_job
    from server.datasets.local import Progress
    from server.shared_cache import model_fingerprint

    for name in ("block_rows", "rows", "threads", "actors"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    fmt, files = input_files(args.input, args.format)
    model = (args.model or _find_model(args.source, args.target)).resolve()
    meta = read_meta(model)
    language_prefix(meta, args.source, args.target)
    changes = {k: v for k, v in (("beam_size", args.beam_size), ("max_new_tokens", args.max_new_tokens))
               if v is not None}
    config = generation_config(meta.generation, changes)
    device = "cuda" if args.gpus_per_actor else resolve_device(args.device).type
    dtype = args.dtype if args.dtype != "auto" else ("int8" if device == "cpu" else "float32")
    output_column = args.output_column or f"{args.column}_{args.target}"
    spec = JobSpec(str(args.input.resolve()), str(args.output.resolve()), fmt, args.column, output_column,
                   args.error_column or f"{output_column}_error", args.source, args.target, str(model),
                   model_fingerprint(model), dtype, device, dataclasses.asdict(config), args.block_rows)
    translate: dict[str, Any] = {
        "model": str(model), "column": spec.column, "source": spec.source, "target": spec.target,
        "output_column": spec.output_column, "error_column": spec.error_column, "dtype": dtype,
        "device": args.device if device != "cpu" else "cpu", "rows": args.rows, "generation": changes,
        "cache_url": args.cache_url or _settings_cache_url(),
    }
    job = open_job(spec, files)
    actors = None
    try:
        run = _runner(job, translate, args)  # Ray joined or the model loaded before the clock starts
        with Progress(job, not args.quiet) as progress:
            actors = run(progress)
        output = job.finish()
    finally:
        job.close()
    summary = {**progress.summary(), "rows": sum(b.rows for b in job.blocks), "blocks": len(job.blocks),
               "ray": args.ray, "actors": actors, "threads": args.threads, "dtype": dtype}
    if args.report:
        args.report.write_text(json.dumps(summary, indent=2) + "\n")
    if not args.quiet:
        print(f"tolk translate-dataset: wrote {output}: {summary['sentences']} sentences in "
              f"{summary['seconds']:.1f} s ({summary['sentences_per_second']:,.0f}/s), "
              f"{summary['errors']} rows with errors", file=sys.stderr)
    return 0


def _runner(job: Job, translate: dict[str, Any], args: argparse.Namespace) -> Callable[[Progress], int | None]:
    """What runs the job's remaining blocks, given the progress bar: here, or on Ray (the actors it used)."""
    if args.ray:
        try:
            from server.datasets import ray_job
        except ImportError as exc:
            raise ValueError(f"--ray needs Ray Data ({exc}); install it with pip install 'tolk[ray]'") from exc
        ray_job.connect(args.ray)
        return lambda progress: ray_job.run_ray(job, translate, progress, args.actors, args.threads or 1,
                                                args.gpus_per_actor)
    import torch

    from server.datasets.batches import Translate
    from server.datasets.local import run_local

    translator = Translate(**translate, threads=args.threads or torch.get_num_threads())
    return lambda progress: run_local(job, translator, progress)


def _find_model(source: str, target: str) -> Path:
    """The first model directory (weights/ or TOLK_MODELS) that translates the pair."""
    from model.checkpoint import read_meta
    from server.datasets.engine import language_prefix
    from server.registry import NoModels, model_dirs
    from server.settings import Settings

    try:
        directories = model_dirs(Settings())
    except NoModels as exc:
        raise ValueError(str(exc)) from exc
    for directory in directories:
        try:
            language_prefix(read_meta(directory), source, target)
            return directory
        except ValueError:
            continue
    raise ValueError(f"no model in {', '.join(map(str, directories))} translates {source} to {target}; pass --model")


def _settings_cache_url() -> str | None:
    from server.settings import Settings

    return Settings().cache_url
