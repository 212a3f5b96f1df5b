"""Zipped documents (docx, pptx, odt, odp, epub) read into memory within bounds, and written back.

Nothing is extracted to disk. Before anything is decompressed, the entry count and the sizes the archive declares
are checked against the limits; while reading, the bytes actually produced are counted too, so an archive that
lies about its sizes is stopped at the limit all the same. Names that would escape the archive's folder (absolute,
`..`, backslashes, drive letters), duplicate names, and entries that are not plain files or folders (symbolic links,
devices: a zip keeps a Unix file type in its external attributes) are refused: they would reach the translated file.
Entries are written back as plain files or folders whatever they claimed.
"""

from __future__ import annotations

import io
import stat
import zipfile
import zlib
from dataclasses import dataclass

from server.errors import InvalidDocument, PayloadTooLarge

CHUNK = 1 << 16


@dataclass(frozen=True)
class Limits:
    expanded_bytes: int  # all entries together, decompressed
    entries: int
    nodes: int = 1_000_000  # elements and attributes of the markup parsed (server/documents/xmltext.py: Budget)


@dataclass
class Entry:
    info: zipfile.ZipInfo
    data: bytes


def _check_name(name: str, archive: str) -> None:
    parts = name.split("/")
    if (not name or name.startswith("/") or "\\" in name or "\x00" in name or ".." in parts
            or (len(name) > 1 and name[1] == ":")):
        raise InvalidDocument(f"{archive} holds an entry whose name leaves its folder: {name[:80]!r}")


def _kind(info: zipfile.ZipInfo) -> int:
    """The Unix file type an entry claims (0 when it claims none, as archives made on Windows)."""
    return stat.S_IFMT(info.external_attr >> 16)


def _check_kind(info: zipfile.ZipInfo, archive: str) -> None:
    if _kind(info) not in (0, stat.S_IFREG, stat.S_IFDIR):
        what = "a symbolic link" if _kind(info) == stat.S_IFLNK else "a special file"
        raise InvalidDocument(f"{archive} holds {what} ({info.filename[:80]!r}); only files and folders are taken")


def read_zip(data: bytes, name: str, limits: Limits) -> list[Entry]:
    """Every entry of a zip archive, in order, within the limits (413) and well-formed (400)."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, OSError) as exc:
        raise InvalidDocument(f"{name} is not a zip archive, or it is damaged (a {name.rsplit('.', 1)[-1]} file "
                              "is one)") from exc
    with archive:
        infos = archive.infolist()
        if len(infos) > limits.entries:
            raise PayloadTooLarge(f"{name} holds {len(infos)} entries; the limit is {limits.entries}")
        declared = sum(info.file_size for info in infos)
        if declared > limits.expanded_bytes:
            raise PayloadTooLarge(f"{name} expands to {declared} bytes; the limit is {limits.expanded_bytes}")
        seen: set[str] = set()
        for info in infos:
            _check_name(info.filename, name)
            _check_kind(info, name)
            if info.filename in seen:
                raise InvalidDocument(f"{name} holds two entries named {info.filename[:80]!r}")
            seen.add(info.filename)
            if info.flag_bits & 0x1:
                raise InvalidDocument(f"{name} is encrypted")
        entries: list[Entry] = []
        total = 0
        for info in infos:
            chunks: list[bytes] = []
            size = 0
            try:
                with archive.open(info) as stream:
                    while chunk := stream.read(CHUNK):
                        size += len(chunk)
                        total += len(chunk)
                        if size > info.file_size or total > limits.expanded_bytes:
                            raise PayloadTooLarge(f"{name} expands past what it declares or past the limit of "
                                                  f"{limits.expanded_bytes} bytes")
                        chunks.append(chunk)
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, RuntimeError,
                    ValueError) as exc:
                raise InvalidDocument(f"{name} is damaged or truncated (entry {info.filename[:80]!r})") from exc
            entries.append(Entry(info, b"".join(chunks)))
    return entries


def write_zip(entries: list[Entry]) -> bytes:
    """An archive of these entries in this order; stored entries stay stored (ODF's and EPUB's `mimetype` must)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for entry in entries:
            info = zipfile.ZipInfo(entry.info.filename, entry.info.date_time)
            stored = entry.info.compress_type == zipfile.ZIP_STORED
            info.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
            info.external_attr = _plain(entry.info)
            archive.writestr(info, entry.data)
    return out.getvalue()


def _plain(info: zipfile.ZipInfo) -> int:
    """The entry's external attributes as a plain file's or folder's, without set-user-ID, set-group-ID or sticky
    bits (read_zip refuses other types; this holds whatever a caller builds)."""
    mode = info.external_attr >> 16
    if not mode:
        return info.external_attr & 0xFFFF
    kind = stat.S_IFDIR if stat.S_IFMT(mode) == stat.S_IFDIR else stat.S_IFREG
    return (kind | stat.S_IMODE(mode) & 0o777) << 16 | info.external_attr & 0xFFFF


def entry_map(entries: list[Entry]) -> dict[str, Entry]:
    return {entry.info.filename: entry for entry in entries}
