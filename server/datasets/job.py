"""A dataset job's blocks, its manifest, and what is left to do: why a killed job resumes where it stopped.

The first run cuts the input into blocks (`formats.scan`) and writes them with the job's arguments into a manifest
beside the parts. A block is done when its part file exists: parts are written under a temporary name and renamed,
so a process killed at any point leaves whole parts or none. A run with the same arguments reads the manifest,
translates only the blocks without a part, and, for a one-file OUTPUT, joins the parts at the end. Decoding is
deterministic, so a block translated again comes out the same: the output is the same however often the job was
stopped. A run with other arguments, or over an input that changed, is refused rather than mixed in.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from server.datasets.formats import (
    EXTENSIONS,
    Block,
    DatasetError,
    Format,
    InputFile,
    find_format,
    join_parts,
    scan,
    schema,
    text_type_problem,
)

log = logging.getLogger(__name__)

MANIFEST = "_tolk_manifest.json"  # a leading underscore: readers of a directory of parts (pyarrow, Ray) skip it
VERSION = 1
WORK_SUFFIX = ".tolk-parts"  # a one-file OUTPUT's parts, until they are joined


@dataclass(frozen=True)
class JobSpec:
    """Everything that decides a job's output; a job resumes only with the same."""

    input: str
    output: str
    format: Format
    column: str
    output_column: str
    error_column: str
    source: str
    target: str
    model: str
    model_fingerprint: str
    dtype: str
    device: str  # the kind: cpu or cuda
    generation: dict[str, Any]  # the whole GenerationConfig
    block_rows: int


@dataclass
class Job:
    spec: JobSpec
    files: list[InputFile]
    blocks: list[Block]
    header: list[str] | None  # a CSV input's columns
    directory: Path  # the parts and the manifest
    single: bool  # OUTPUT is one file, joined from the parts at the end
    lock: IO[bytes] | None = None  # the manifest, held open and locked while this process runs the job

    def part(self, block: Block) -> Path:
        """Where a block's translation goes."""
        return self.directory / f"part-{block.index:06d}{EXTENSIONS[self.spec.format][0]}"

    def remaining(self) -> list[Block]:
        """The blocks without a part yet."""
        return [b for b in self.blocks if not self.part(b).exists()]

    def finish(self) -> Path:
        """Join a one-file OUTPUT's parts (then remove them and the manifest, last); OUTPUT."""
        output = Path(self.spec.output)
        missing = self.remaining()
        if missing:
            raise DatasetError(f"{len(missing)} blocks are not translated yet (block {missing[0].index} first)")
        if self.single:
            join_parts(self.spec.format, [self.part(b) for b in self.blocks], output)
            for block in self.blocks:  # a run killed while these go resumes: it translates what went again
                self.part(block).unlink(missing_ok=True)
            (self.directory / MANIFEST).unlink()
            self.close()
            self.directory.rmdir()
        return output

    def close(self) -> None:
        if self.lock is not None:
            self.lock.close()  # the lock goes with it
            self.lock = None


def layout(output: Path, fmt: Format) -> tuple[Path, bool]:
    """Where the parts of OUTPUT go, and whether OUTPUT is one file (its name ends as its format's files do)."""
    named = find_format(output)
    if named is None:
        return output, False
    if named != fmt:
        raise DatasetError(f"{output} names a {named} file, but the input is {fmt}; the output keeps the input's "
                           f"format (name a {EXTENSIONS[fmt][0]} file or a directory)")
    return output.with_name(output.name + WORK_SUFFIX), True


def open_job(spec: JobSpec, files: list[InputFile]) -> Job:
    """The job of these arguments: resumed from its manifest, or planned anew; locked against a second runner."""
    output = Path(spec.output)
    directory, single = layout(output, spec.format)
    manifest = directory / MANIFEST
    if manifest.exists():
        job = _resume(spec, files, manifest, directory, single)
    else:
        if single and output.exists():
            raise DatasetError(f"{output} exists (a finished job, or another file); remove it to translate again")
        if directory.exists() and any(not _temporary(p) for p in directory.iterdir()):
            raise DatasetError(f"{directory} holds files that no tolk translate-dataset job wrote; name an empty "
                               "or new directory")
        header = _check_columns(spec, files)
        blocks = scan(spec.format, files, spec.block_rows)
        directory.mkdir(parents=True, exist_ok=True)
        job = Job(spec, files, blocks, header, directory, single)
        _write_manifest(job, manifest)
        log.info("planned %d blocks of at most %d rows in %s", len(blocks), spec.block_rows, directory)
    job.lock = _locked(manifest)
    for stale in directory.glob(".part-*.tmp"):  # a part whose writer was killed
        stale.unlink(missing_ok=True)
    return job


def _resume(spec: JobSpec, files: list[InputFile], manifest: Path, directory: Path, single: bool) -> Job:
    try:
        saved = json.loads(manifest.read_text())
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cannot read the job's manifest {manifest}: {exc}") from exc
    if saved.get("version") != VERSION:
        raise DatasetError(f"{manifest} was written by another version of tolk translate-dataset")
    old = saved["spec"]
    changed = [f"{k} ({old.get(k)!r} then, {v!r} now)" for k, v in dataclasses.asdict(spec).items()
               if old.get(k) != v]
    if changed:
        raise DatasetError(f"{directory} holds a job begun with other arguments: {'; '.join(changed)}. Run it "
                           "with those, or name another OUTPUT")
    if [dataclasses.asdict(f) for f in files] != saved["files"]:
        raise DatasetError(f"the input changed since the job began ({spec.input}); its parts in {directory} would "
                           "not match. Name another OUTPUT, or remove that one")
    blocks = [Block(*b) for b in saved["blocks"]]
    job = Job(spec, files, blocks, saved["header"], directory, single)
    log.info("resuming: %d of %d blocks left", len(job.remaining()), len(blocks))
    return job


def _check_columns(spec: JobSpec, files: list[InputFile]) -> list[str] | None:
    """The CSV header, after checking every file has the text column and none has an output column already."""
    headers = [schema(spec.format, f) for f in files]
    for file, names in zip(files, headers, strict=True):
        if names is None:
            continue  # JSON Lines: a record without the column is a null cell
        if spec.column not in names:
            raise DatasetError(f"{file.path} has no column {spec.column!r}; its columns: {', '.join(names)}")
        for name in (spec.output_column, spec.error_column):
            if name in names:
                raise DatasetError(f"{file.path} already has a column {name!r}; choose another with --output-column "
                                   "or --error-column")
        problem = text_type_problem(spec.format, file, spec.column)
        if problem:
            raise DatasetError(problem)
    if spec.format == "csv" and any(h != headers[0] for h in headers):
        raise DatasetError(f"the CSV files of {spec.input} have different headers")
    return headers[0] if spec.format == "csv" else None


def _temporary(path: Path) -> bool:
    """A file a killed writer left (a part or the manifest under its temporary name)."""
    return path.name.startswith(".") and path.name.endswith(".tmp")


def _write_manifest(job: Job, path: Path) -> None:
    body = {"version": VERSION, "spec": dataclasses.asdict(job.spec),
            "files": [dataclasses.asdict(f) for f in job.files], "header": job.header,
            "blocks": [dataclasses.astuple(b) for b in job.blocks]}
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w") as f:
        json.dump(body, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def _locked(manifest: Path) -> IO[bytes]:
    handle = open(manifest, "rb")  # noqa: SIM115 (held open for the job's length: the lock lives as long)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.close()
        raise DatasetError(f"another tolk translate-dataset is running this job ({manifest.parent})") from exc
    return handle
