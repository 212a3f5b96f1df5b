"""Dataset files as blocks of rows: Parquet, JSON Lines and CSV read in row ranges, parts written and joined.

A job cuts its input into blocks of consecutive rows, once (`scan`), so that any process can read any block alone
(`read_block`): a Parquet block from its file's row groups, a CSV or JSON Lines block from the byte range its records
span, found by one pass over the file. Every block of a format comes out with the same columns, so parts written
from different blocks, processes or runs join into one file (`join_parts`).

CSV cells are read as text, and a cell left empty without quotes as null, so a row is written back as it came
(numbers keep their digits, `007` stays `007`). A JSON Lines record is kept as its line and written back with the
output keys added, since pyarrow's JSON reader would infer each field's type anew in every block.
"""

from __future__ import annotations

import io
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

Format = Literal["parquet", "jsonl", "csv"]
EXTENSIONS: dict[Format, tuple[str, ...]] = {
    "parquet": (".parquet", ".pq"), "jsonl": (".jsonl", ".ndjson", ".json"), "csv": (".csv",),
}
RECORD = "__tolk_record"  # a JSON Lines block's lines, as read
PRESET = "__tolk_error"  # a row's error found while reading (a JSON value that is not text); never translated


class DatasetError(Exception):
    """A problem with the input or output that stops the job, as one line for the user."""


@dataclass(frozen=True)
class InputFile:
    path: str  # absolute
    size: int
    mtime_ns: int  # with size: a changed input is noticed when a job resumes


@dataclass(frozen=True)
class Block:
    """Rows [first_row, first_row + rows) of one input file; for CSV and JSON Lines the bytes they span."""

    index: int
    file: int  # into the job's input files
    first_row: int
    rows: int
    start: int = 0
    end: int = 0


def find_format(path: Path) -> Format | None:
    """The format a file's extension names, or None."""
    suffix = path.suffix.lower()
    return next((f for f, exts in EXTENSIONS.items() if suffix in exts), None)


def input_files(path: Path, fmt: Format | None) -> tuple[Format, list[InputFile]]:
    """INPUT's files in name order (a file, or a directory's files of one format) and their format."""
    if not path.exists():
        raise DatasetError(f"{path} does not exist")
    if path.is_file():
        fmt = fmt or find_format(path)
        if fmt is None:
            raise DatasetError(f"cannot tell the format of {path} from its extension; pass --format")
        files = [path]
    else:
        candidates = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith((".", "_")))
        formats = {f for p in candidates if (f := find_format(p)) is not None}
        if fmt is None and len(formats) > 1:
            raise DatasetError(f"{path} holds files of several formats ({', '.join(sorted(formats))}); pass --format")
        fmt = fmt or next(iter(formats), None)
        files = [p for p in candidates if find_format(p) == fmt]
        if fmt is None or not files:
            raise DatasetError(f"{path} holds no Parquet, JSON Lines or CSV file")
    found = []
    for p in files:
        stat = p.stat()
        found.append(InputFile(str(p.resolve()), stat.st_size, stat.st_mtime_ns))
    return fmt, found


def csv_header(path: str) -> list[str]:
    """A CSV file's column names (its first record)."""
    try:
        names: list[str] = pcsv.read_csv(io.BytesIO(_first_record(path)), parse_options=_CSV_PARSE).column_names
    except pa.ArrowInvalid as exc:
        raise DatasetError(f"{path}: cannot read its CSV header: {exc}") from exc
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise DatasetError(f"{path}: the CSV header names {', '.join(duplicated)} more than once")
    return names


def schema(fmt: Format, file: InputFile) -> list[str] | None:
    """The column names of a Parquet or CSV file (None for JSON Lines, whose records name their own keys)."""
    if fmt == "parquet":
        return list(_parquet(file.path).schema_arrow.names)
    return csv_header(file.path) if fmt == "csv" else None


def text_type_problem(fmt: Format, file: InputFile, column: str) -> str | None:
    """Why a Parquet column cannot hold text to translate, or None (CSV cells are always text)."""
    if fmt != "parquet":
        return None
    kind = _parquet(file.path).schema_arrow.field(column).type
    return None if is_text(kind) else f"column {column!r} of {file.path} holds {kind} values, not text"


def is_text(kind: pa.DataType) -> bool:
    """Whether an Arrow column of this type holds text (or only nulls)."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
                or pa.types.is_null(kind))


def scan(fmt: Format, files: list[InputFile], block_rows: int) -> list[Block]:
    """Every input file cut into blocks of at most block_rows rows, in order."""
    blocks: list[Block] = []
    for f, file in enumerate(files):
        if fmt == "parquet":
            total = _parquet(file.path).metadata.num_rows
            ranges = [(r, min(block_rows, total - r), 0, 0) for r in range(0, total, block_rows)]
        else:
            ranges = list(_line_blocks(file.path, block_rows, csv=fmt == "csv"))
        blocks += [Block(len(blocks) + k, f, *r) for k, r in enumerate(ranges)]
    return blocks


def read_block(fmt: Format, file: InputFile, block: Block, column: str, header: list[str] | None) -> pa.Table:
    """A block's rows as a table (JSON Lines: the text column, the records and their errors; `header`: CSV's)."""
    if fmt == "parquet":
        table = _read_parquet_rows(file.path, block.first_row, block.rows)
    else:
        with open(file.path, "rb") as f:
            f.seek(block.start)
            data = f.read(block.end - block.start)
        if fmt == "csv":
            where = f"{file.path} (rows {block.first_row + 1} on)"
            table = _read_csv_bytes(data, header or csv_header(file.path), where)
        else:
            table = _read_json_lines(data, column, file.path, block.first_row)
    if table.num_rows != block.rows:
        raise DatasetError(f"{file.path} changed while the job ran: rows {block.first_row + 1} to "
                           f"{block.first_row + block.rows} read as {table.num_rows} rows")
    return table


def write_part(fmt: Format, table: pa.Table, path: Path, column: str) -> None:
    """Write a translated block, whole or not at all: to a temporary name, then renamed (atomic on one file system).
    `column`: the text column (JSON Lines records hold it already)."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temporary, "wb") as sink:
            _write(fmt, table, sink, header=True, column=column)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def join_parts(fmt: Format, parts: list[Path], output: Path) -> None:
    """The parts, in order, as one file (written under a temporary name, then renamed)."""
    temporary = output.with_name(f".{output.name}.{uuid.uuid4().hex}.tmp")
    try:
        if fmt == "parquet":
            _join_parquet(parts, temporary)
        else:
            with open(temporary, "wb") as sink:
                for k, part in enumerate(parts):
                    if fmt == "jsonl":
                        with open(part, "rb") as f:
                            while chunk := f.read(1 << 20):
                                sink.write(chunk)
                    else:
                        _write(fmt, read_part(fmt, part), sink, header=k == 0, column="")
                sink.flush()
                os.fsync(sink.fileno())
        os.replace(temporary, output)
    finally:
        temporary.unlink(missing_ok=True)


def read_part(fmt: Format, path: Path) -> pa.Table:
    """A part (or a whole output file) as written: JSON Lines as one column of records."""
    if fmt == "parquet":
        return pq.read_table(path)
    if fmt == "csv":
        with open(path, "rb") as f:
            data = f.read()
        header = pcsv.read_csv(io.BytesIO(_first_record_of(data)), parse_options=_CSV_PARSE).column_names
        return _read_csv_bytes(data[len(_first_record_of(data)):], header, str(path))
    lines = path.read_text(encoding="utf-8").split("\n")  # not splitlines: U+2028 may stand inside a JSON string
    return pa.table({RECORD: [line for line in lines if line]})


def _write(fmt: Format, table: pa.Table, sink: Any, header: bool, column: str) -> None:
    if fmt == "parquet":
        pq.write_table(table, sink)
    elif fmt == "csv":
        pcsv.write_csv(table, sink, pcsv.WriteOptions(include_header=header, quoting_style="needed"))
    else:
        sink.write("".join(f"{line}\n" for line in json_records(table, column)).encode())


def json_records(table: pa.Table, column: str) -> Iterator[str]:
    """A translated JSON Lines block's lines: each record with the columns added to it (not the text column's,
    which the record holds already)."""
    added = [n for n in table.column_names if n not in (RECORD, column)]
    values = {n: table.column(n).to_pylist() for n in added}
    for i, record in enumerate(table.column(RECORD).to_pylist()):
        obj = json.loads(record)
        for n in added:
            obj[n] = values[n][i]
        yield json.dumps(obj, ensure_ascii=False)


# CSV as written by spreadsheets and pandas: quoted cells may hold line breaks
_CSV_PARSE = pcsv.ParseOptions(newlines_in_values=True)


def _read_csv_bytes(data: bytes, header: list[str], where: str) -> pa.Table:
    if not data:
        return pa.table({n: pa.array([], pa.string()) for n in header})
    try:
        return pcsv.read_csv(
            io.BytesIO(data), read_options=pcsv.ReadOptions(column_names=header), parse_options=_CSV_PARSE,
            convert_options=pcsv.ConvertOptions(column_types={n: pa.string() for n in header},
                                                strings_can_be_null=True, quoted_strings_can_be_null=False,
                                                null_values=[""]))
    except pa.ArrowInvalid as exc:
        raise DatasetError(f"{where}: not CSV as its header says: {exc}") from exc


def _read_json_lines(data: bytes, column: str, path: str, first_row: int) -> pa.Table:
    texts: list[str | None] = []
    records: list[str] = []
    problems: list[str | None] = []
    for line in data.decode("utf-8").split("\n"):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}: record {first_row + len(records) + 1} is not JSON ({exc})") from exc
        if not isinstance(obj, dict):
            raise DatasetError(f"{path}: record {first_row + len(records) + 1} is not a JSON object")
        value = obj.get(column)
        texts.append(value if isinstance(value, str) else None)
        problems.append(None if value is None or isinstance(value, str)
                        else f"{column!r} holds {type(value).__name__} {json.dumps(value)[:40]}, not text")
        records.append(line.rstrip("\r"))
    return pa.table({column: pa.array(texts, pa.string()), RECORD: pa.array(records, pa.string()),
                     PRESET: pa.array(problems, pa.string())})


def _line_blocks(path: str, block_rows: int, csv: bool) -> Iterator[tuple[int, int, int, int]]:
    """(first row, rows, start, end) of each block of a CSV (after its header) or JSON Lines file.

    A CSV record ends at a line break outside quotes: with quotes doubled inside quoted cells (RFC 4180), where
    the count of quotes so far is even. Empty lines hold no record, as pyarrow reads them.
    """
    rows = 0
    start = offset = 0
    quoted = False
    with open(path, "rb") as f:
        if csv:
            offset = start = len(_first_record(path))
            f.seek(offset)
        for line in f:
            if not quoted and not (line.strip() if not csv else line.strip(b"\r\n")):
                offset += len(line)
                if rows % block_rows == 0:
                    start = offset  # a block starts at its first record
                continue
            if csv and line.count(b'"') % 2:
                quoted = not quoted
            offset += len(line)
            if not quoted:
                rows += 1
                if rows % block_rows == 0:
                    yield rows - block_rows, block_rows, start, offset
                    start = offset
    if quoted:
        raise DatasetError(f"{path}: a quoted CSV cell is never closed")
    if rows % block_rows:
        yield rows - rows % block_rows, rows % block_rows, start, offset


def _first_record(path: str) -> bytes:
    with open(path, "rb") as f:
        head = b""
        for line in f:
            head += line
            if head.count(b'"') % 2 == 0:
                return head
    return head


def _first_record_of(data: bytes) -> bytes:
    end = 0
    while True:
        newline = data.find(b"\n", end)
        end = len(data) if newline < 0 else newline + 1
        if data[:end].count(b'"') % 2 == 0 or newline < 0:
            return data[:end]


def _parquet(path: str) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DatasetError(f"{path}: not a readable Parquet file ({exc})") from exc


def _read_parquet_rows(path: str, first: int, rows: int) -> pa.Table:
    """Rows [first, first + rows) of a Parquet file, reading only the row groups that hold them."""
    meta = _parquet(path).metadata
    groups: list[int] = []
    at = skip = 0
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        if at + n > first and at < first + rows:
            if not groups:
                skip = first - at
            groups.append(g)
        at += n
    return _parquet(path).read_row_groups(groups).slice(skip, rows)


def _join_parquet(parts: list[Path], output: Path) -> None:
    schemas = [pq.read_schema(p) for p in parts]
    try:
        joined = pa.unify_schemas(schemas) if schemas else pa.schema([])
    except pa.ArrowInvalid as exc:
        raise DatasetError(f"the input files' columns do not agree, so they cannot make one file ({exc}); "
                           "name an output directory instead") from exc
    with pq.ParquetWriter(output, joined) as writer:
        for part in parts:
            table = pq.read_table(part)
            columns = [table.column(f.name) if f.name in table.column_names else pa.nulls(len(table), f.type)
                       for f in joined]
            writer.write_table(pa.Table.from_arrays(columns, schema=joined))
