"""Private apt configuration: index updates, package download and extraction.

Everything lives under the work directory so that the system apt state is never
touched.  Sources are copied from the system's apt configuration rather than
spelled out here.
"""

from __future__ import annotations

import glob
import logging
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SYSTEM_SOURCE_LIST = Path("/etc/apt/sources.list")
SYSTEM_SOURCE_PARTS = Path("/etc/apt/sources.list.d")


@dataclass(frozen=True)
class AptEnv:
    """A private apt state directory (sources, lists, cache) under ``root``."""

    root: Path

    @property
    def lists(self) -> Path:
        return self.root / "lists"

    @property
    def debs(self) -> Path:
        return self.root / "debs"

    def options(self) -> list[str]:
        """Command line ``-o`` options pointing apt at the private state."""
        opts = {
            "Dir::State": str(self.root / "state"),
            "Dir::State::Lists": str(self.lists),
            "Dir::State::status": "/var/lib/dpkg/status",
            "Dir::Cache": str(self.root / "cache"),
            "Dir::Etc::SourceList": str(self.root / "sources.list"),
            "Dir::Etc::SourceParts": str(self.root / "sources.list.d"),
            "Acquire::Languages": "pt_BR,en",
            "Acquire::GzipIndexes": "false",
            "Debug::NoLocking": "1",
        }
        out: list[str] = []
        for key, value in opts.items():
            out += ["-o", f"{key}={value}"]
        return out


def _copy_sources(env: AptEnv) -> None:
    """Copy the system's enabled apt sources into the private configuration."""
    parts = env.root / "sources.list.d"
    parts.mkdir(parents=True, exist_ok=True)
    target_list = env.root / "sources.list"
    if SYSTEM_SOURCE_LIST.exists():
        shutil.copyfile(SYSTEM_SOURCE_LIST, target_list)
    else:
        target_list.write_text("")
    for pattern in ("*.list", "*.sources"):
        for src in glob.glob(str(SYSTEM_SOURCE_PARTS / pattern)):
            shutil.copyfile(src, parts / Path(src).name)


def prepare(root: Path, refresh: bool = False) -> AptEnv:
    """Create the private apt state under ``root`` and run ``apt-get update``.

    The update is skipped when translation indexes are already present and
    ``refresh`` is false, which keeps re-runs fast.
    """
    env = AptEnv(root.resolve())
    for sub in ("lists/partial", "cache/archives/partial", "state", "debs"):
        (env.root / sub).mkdir(parents=True, exist_ok=True)
    have = list(env.lists.glob("*Translation-pt*"))
    if have and not refresh:
        return env
    _copy_sources(env)
    log.info("apt-get update (private lists in %s)", env.lists)
    subprocess.run(["apt-get", "update", "-q", *env.options()],
                   check=True, stdout=subprocess.DEVNULL)
    return env


def apt_cache(env: AptEnv, *args: str) -> str:
    """Run ``apt-cache`` against the private state and return stdout."""
    res = subprocess.run(["apt-cache", *env.options(), *args],
                         check=False, capture_output=True, text=True)
    return res.stdout


def package_info(env: AptEnv, names: list[str]) -> dict[str, dict[str, str]]:
    """Return candidate ``Version``, ``Size`` (bytes) per available package."""
    info: dict[str, dict[str, str]] = {}
    if not names:
        return info
    text = apt_cache(env, "show", "--no-all-versions", *names)
    for stanza in text.split("\n\n"):
        fields = _parse_stanza(stanza)
        if "Package" in fields:
            info.setdefault(fields["Package"], fields)
    return info


def _parse_stanza(stanza: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in stanza.splitlines():
        if line and not line[0].isspace() and ":" in line:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def download(env: AptEnv, name: str) -> Path | None:
    """Download ``name`` into the private deb directory; reuse an existing file."""
    existing = sorted(env.debs.glob(f"{name}_*.deb"))
    if existing:
        return existing[-1]
    res = subprocess.run(["apt-get", "download", "-q", *env.options(), name],
                         cwd=env.debs, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        log.warning("download of %s failed: %s", name, res.stderr.strip()[-300:])
        return None
    found = sorted(env.debs.glob(f"{name}_*.deb"))
    return found[-1] if found else None


def extract(deb: Path, dest: Path, patterns: list[str] | None = None) -> Path:
    """Extract ``deb`` into ``dest`` (all files, or only tar ``patterns``).

    A ``.done`` marker makes the step resumable.  Copyright files are always
    included so that the NOTICE can be written.
    """
    if not fresh_folder(dest):
        return dest
    if patterns is None:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
    else:
        wild = [*patterns, "./usr/share/doc/*/copyright"]
        tar = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)],
                               stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(dest), "--wildcards",
                        "--no-anchored", "--ignore-failed-read", *wild],
                       stdin=tar.stdout, check=False, stderr=subprocess.DEVNULL)
        if tar.stdout is not None:
            tar.stdout.close()
        tar.wait()
    (dest / ".done").write_text(deb.name + "\n")
    return dest


def fresh_folder(dest: Path) -> bool:
    """False when `dest` holds a finished extraction (its `.done` marker, written last); otherwise True, with `dest`
    emptied of what an interrupted one left."""
    if (dest / ".done").exists():
        return False
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    return True


def download_many(env: AptEnv, names: list[str], batch: int = 40) -> dict[str, Path]:
    """Download several packages (batched ``apt-get download`` calls).

    Packages already present are reused; unknown names are skipped with a
    warning.  Returns the ``.deb`` path per package that is available.
    """
    _clean_partial(env)
    available = set(package_info(env, names))
    for name in sorted(set(names) - available):
        log.warning("package %s not available; skipped", name)
    missing = [n for n in names if n in available and not _existing(env, n)]
    for start in range(0, len(missing), batch):
        chunk = missing[start:start + batch]
        log.info("downloading %d packages (%d/%d)", len(chunk), start + len(chunk), len(missing))
        res = subprocess.run(["apt-get", "download", "-q", *env.options(), *chunk],
                             cwd=env.debs, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            log.warning("batch download failed, retrying one by one: %s", res.stderr.strip()[-300:])
            for name in chunk:
                download(env, name)
    found = {n: _existing(env, n) for n in names if n in available}
    return {n: p for n, p in found.items() if p is not None}


def _existing(env: AptEnv, name: str) -> Path | None:
    found = sorted(env.debs.glob(f"{name}_*.deb"))
    return found[-1] if found else None


def _clean_partial(env: AptEnv) -> None:
    """Remove half-written downloads left by an interrupted run."""
    for part in env.debs.glob("*.FAILED"):
        part.unlink()
