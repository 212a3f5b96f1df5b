"""Argos Translate (LibreTranslate) packages, and `tolk import` of whatever it is given.

An Argos package is a zip (`.argosmodel`) of one folder: metadata.json (from_code, to_code, package_version, ...),
model/ (a CTranslate2 model, `model.ct2_import`), sentencepiece.model (one model for both sides), README.md and
sentence-splitting data Tolk does not need. The package index (index.json, a list of such metadata with `links`)
is the one argostranslate reads; TOLK_ARGOS_INDEX names another (file:// and http:// work). An imported package
decodes as argostranslate decodes it (ARGOS_GENERATION, written as the model's generation.json).

Everything is written beside its destination and renamed into place: a failed import or pull leaves nothing
half-written there. Downloads go to the user's cache (XDG_CACHE_HOME/tolk/argos), where an interrupted one resumes.
A zip is checked before anything is extracted (no entry may leave its folder, nor unpack past MAX_UNPACKED; CRCs as
each entry is read), and only what Tolk reads is extracted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from model import checkpoint
from model.ct2_import import import_ct2
from model.marian import import_marian
from model.marian_format import UnsupportedCheckpoint, read_json

DEFAULT_INDEX = "https://raw.githubusercontent.com/argosopentech/argospm-index/main/index.json"
CODES = {"pb": "pt-BR", "zt": "zh-Hant"}  # Argos's own codes, as standard tags
CHUNK = 1 << 20
MAX_UNPACKED = 16 << 30  # bytes a package may unpack to: a zip bomb is refused before it fills the disk
# How argostranslate (so LibreTranslate) decodes a package: translate.py calls CTranslate2's translate_batch with
# beam_size=max(num_hypotheses, 4), length_penalty=0.2 and replace_unknowns=True (an unknown token written as the
# source piece it attends to most), leaving min_decoding_length at CTranslate2's 1 (never an empty translation).
# Written as the import's generation.json, so that the same package gives the same sentences.
ARGOS_GENERATION = {"beam_size": 4, "length_penalty": 0.2, "min_new_tokens": 1, "replace_unknowns": True}


def write_aside(out: Path, build: Callable[[Path], Path | None], force: bool = False) -> Path:
    """build(staging directory) beside out, then renamed to out; nothing is left behind when build raises."""
    if out.exists() and any(out.iterdir()) and not force:
        raise FileExistsError(f"{out} exists and is not empty (use --force to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp:
        staged = Path(tmp) / "model"
        build(staged)
        if out.exists():
            shutil.rmtree(out)
        staged.rename(out)
    return out


def unpack(archive: Path, dest: Path) -> Path:
    """Extract what Tolk reads of an .argosmodel zip into dest, checked first: the package's folder."""
    if not zipfile.is_zipfile(archive):
        raise UnsupportedCheckpoint(f"{archive} is not a zip archive (truncated or not an Argos package)")
    try:
        with zipfile.ZipFile(archive) as z:
            root = dest.resolve()
            for entry in z.infolist():
                target = (root / entry.filename).resolve()
                if entry.filename.startswith(("/", "\\")) or not target.is_relative_to(root):
                    raise UnsupportedCheckpoint(f"{archive}: the entry {entry.filename!r} escapes its folder")
                if (entry.external_attr >> 16) & 0o170000 == 0o120000:
                    raise UnsupportedCheckpoint(f"{archive}: the entry {entry.filename!r} is a symbolic link")
            wanted = [e for e in z.infolist() if not e.is_dir() and needed(e.filename)]
            if sum(e.file_size for e in wanted) > MAX_UNPACKED:
                raise UnsupportedCheckpoint(f"{archive} unpacks to more than {MAX_UNPACKED >> 30} GiB")
            for entry in wanted:  # CRCs checked as each entry is read
                z.extract(entry, dest)
    except (zipfile.BadZipFile, EOFError, zlib.error) as e:
        raise UnsupportedCheckpoint(f"{archive} is corrupt ({e})") from e
    return package_root(dest)


def needed(name: str) -> bool:
    """The entries of a package Tolk reads (not its sentence splitters' data)."""
    parts = name.split("/")
    inner = parts[1:] if len(parts) > 1 else parts
    return inner[:1] == ["model"] or inner in (["metadata.json"], ["sentencepiece.model"], ["bpe.model"],
                                              ["README.md"])


def package_root(directory: Path) -> Path:
    """The folder of an unpacked package: the one holding metadata.json (the given one, or its only subfolder)."""
    if (directory / "metadata.json").is_file():
        return directory
    folders = [p for p in directory.iterdir() if p.is_dir()]
    if len(folders) == 1 and (folders[0] / "metadata.json").is_file():
        return folders[0]
    raise FileNotFoundError(f"{directory}: no metadata.json (not an Argos package)")


def import_package(root: Path, out: Path, name: str | None = None) -> Path:
    """An unpacked Argos package's model as a Tolk model directory (written into out)."""
    meta = read_json(root / "metadata.json")
    if meta.get("type", "translate") != "translate" or not meta.get("from_code") or not meta.get("to_code"):
        raise UnsupportedCheckpoint(f"{root}: metadata.json describes no translation package (type, from_code, "
                                    "to_code)")
    if meta.get("target_prefix"):
        raise UnsupportedCheckpoint(f"{root}: multilingual packages (target_prefix) are not supported")
    sp = root / "sentencepiece.model"
    if not sp.is_file():
        other = " (it has a BPE model, which Tolk does not read)" if (root / "bpe.model").exists() else ""
        raise FileNotFoundError(f"{root}: the SentencePiece file sentencepiece.model is missing{other}")
    source, target = (CODES.get(meta[k], meta[k]) for k in ("from_code", "to_code"))
    info = checkpoint.ModelInfo(name or f"argos-{meta['from_code']}-{meta['to_code']}", source, target)
    readme = root / "README.md"
    card = (f"Argos package {meta['from_code']} -> {meta['to_code']}, version {meta.get('package_version', '?')}."
            "\n\n" + (readme.read_text(encoding="utf-8") if readme.is_file() else ""))
    return import_ct2(root / "model", out, info, (sp, sp), ARGOS_GENERATION, card=card)


def import_any(src: Path, out: Path, name: str | None = None, source_language: str | None = None,
               target_language: str | None = None, force: bool = False) -> Path:
    """`tolk import`: an .argosmodel file, an unpacked Argos package, a CTranslate2 model directory or a Hugging Face
    Marian checkpoint, recognised by its files, written aside and renamed into out."""

    def build(staged: Path) -> None:
        if src.is_file():
            with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-unpack-") as tmp:
                import_package(unpack(src, Path(tmp)), staged, name)
        elif (src / "metadata.json").is_file() or (src / "model" / "model.bin").is_file():
            import_package(src, staged, name)
        elif (src / "model.bin").is_file():
            import_ct2(src, staged, checkpoint.ModelInfo(name or src.resolve().name, source_language or "und",
                                                         target_language or "und"))
        elif (src / "config.json").is_file():
            import_marian(src, staged, name, source_language, target_language)
        else:
            raise FileNotFoundError(f"{src} is not a Marian checkpoint, CTranslate2 model or Argos package")
        if source_language or target_language:  # the user's word over the files'
            info = checkpoint.ModelInfo.load(staged / "info.json")
            info = checkpoint.ModelInfo(info.name, source_language or info.source_language,
                                        target_language or info.target_language)
            (staged / "info.json").write_text(json.dumps(info.__dict__, indent=2) + "\n")

    if not src.exists():
        raise FileNotFoundError(f"{src} does not exist")
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_aside(out, build, force)


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in str(version).split("."))


def read_index(url: str) -> list[dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            data = json.loads(response.read())
    except (urllib.error.URLError, OSError) as e:
        raise ValueError(f"cannot read the Argos index {url} ({e}): no network, or set TOLK_ARGOS_INDEX") from e
    except ValueError as e:
        raise ValueError(f"the Argos index {url} is not JSON ({e})") from e
    if not isinstance(data, list):
        raise ValueError(f"the Argos index {url} is not a list of packages")
    return [p for p in data if isinstance(p, dict)]


def newest(index: list[dict[str, Any]], source: str, target: str) -> dict[str, Any]:
    """The newest translation package for a pair (codes as Argos writes them, or their standard tags)."""
    theirs = {v: k for k, v in CODES.items()}
    source, target = theirs.get(source, source), theirs.get(target, target)
    found = [p for p in index if p.get("type", "translate") == "translate" and p.get("from_code") == source
             and p.get("to_code") == target and p.get("links")]
    if not found:
        raise ValueError(f"the Argos index has no package from {source} to {target}")
    return max(found, key=lambda p: version_key(p.get("package_version", "0")))


def download(links: list[str], part: Path) -> None:
    """The first link that answers into part, resuming a partial file over HTTP (Range) when the server allows."""
    from tqdm import tqdm

    errors = []
    for link in links:
        have = part.stat().st_size if part.exists() else 0
        request = urllib.request.Request(link, headers={"Range": f"bytes={have}-"} if have else {})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                resumed = have and getattr(response, "status", 200) == 206
                total = int(response.headers.get("Content-Length") or 0) + (have if resumed else 0)
                with open(part, "ab" if resumed else "wb") as f, tqdm(
                        total=total or None, initial=have if resumed else 0, unit="B", unit_scale=True,
                        desc=part.name, disable=not sys.stderr.isatty()) as bar:
                    while chunk := response.read(CHUNK):
                        f.write(chunk)
                        bar.update(len(chunk))
            return
        except (urllib.error.URLError, OSError) as e:
            errors.append(f"{link}: {e}")
    raise ValueError("cannot download the package (no network?): " + "; ".join(errors))


def check_sum(package: dict[str, Any], path: Path) -> None:
    expected = str(package.get("sha256") or package.get("checksum") or "")
    if not expected:
        return
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != expected.removeprefix("sha256:").lower():
        path.unlink()
        raise ValueError(f"checksum mismatch for {path.name}: the index says {expected}, the file has "
                         f"sha256 {digest.hexdigest()}")


def pull_argos(pair: str, out: Path | None = None, weights_dir: Path = Path("weights"),
               index_url: str | None = None, force: bool = False) -> Path:
    """`tolk pull argos:FROM-TO`: the newest package of the pair from the index, downloaded (resuming a partial
    download), its checksum checked when the index gives one, and imported; an existing model directory is kept."""
    source, _, target = pair.partition("-")
    if not source or not target:
        raise ValueError(f"argos:{pair}: give a pair as argos:FROM-TO, e.g. argos:en-de")
    out = out if out is not None else weights_dir / f"argos-{source}-{target}"
    if (out / "config.json").is_file() and not force:
        return out
    package = newest(read_index(index_url or os.environ.get("TOLK_ARGOS_INDEX") or DEFAULT_INDEX), source, target)
    cache = downloads_dir()
    cache.mkdir(parents=True, exist_ok=True)
    part = cache / f"{source}-{target}-{package.get('package_version', '0')}.argosmodel.part"
    download([str(link) for link in package["links"]], part)
    check_sum(package, part)
    try:
        import_any(part, out, out.name, force=True)
    except UnsupportedCheckpoint:
        part.unlink()  # a corrupt file must not be resumed
        raise
    part.unlink()
    return out


def downloads_dir() -> Path:
    """Where a package downloads (a partial one stays there for the next pull to resume): never under weights/."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tolk" / "argos"


def add_import_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", type=Path, help="a Marian checkpoint, CTranslate2 model directory, Argos package "
                                          "(.argosmodel) or unpacked package")
    p.add_argument("out_dir", type=Path, help="Tolk model directory to write")
    p.add_argument("--name", default=None, help="model name (default: from the package or the directory)")
    p.add_argument("--source-language", default=None, help="default: from the files")
    p.add_argument("--target-language", default=None)
    p.add_argument("--force", action="store_true", help="replace a non-empty output directory")


def import_main(args: argparse.Namespace) -> int:
    try:
        out = import_any(args.src, args.out_dir, args.name, args.source_language, args.target_language, args.force)
    except (ValueError, OSError) as e:
        print(f"tolk import: error: {e}", file=sys.stderr)
        return 1
    info = checkpoint.ModelInfo.load(out / "info.json")
    print(f"imported {args.src} -> {out} ({info.source_language} -> {info.target_language})")
    return 0
