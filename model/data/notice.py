"""NOTICE generation: package versions and summarised licence names."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

_LICENSE_FIELD = re.compile(r"^License:\s*(.+)$", re.MULTILINE)
_KEYWORDS = (
    ("GNU Lesser General Public License", "LGPL"),
    ("GNU Library General Public License", "LGPL"),
    ("GNU Free Documentation License", "GFDL"),
    ("GNU General Public License", "GPL"),
    ("Mozilla Public License", "MPL"),
    ("Creative Commons", "CC"),
    ("Apache License", "Apache"),
    ("Artistic License", "Artistic"),
    ("common-licenses/GPL", "GPL"),
    ("common-licenses/LGPL", "LGPL"),
    ("common-licenses/GFDL", "GFDL"),
    ("common-licenses/MPL", "MPL"),
    ("common-licenses/Apache", "Apache"),
    ("public domain", "public-domain"),
)
_FAMILIES = ("LGPL", "AGPL", "GPL", "GFDL", "MPL", "CC-BY-SA", "CC-BY", "CC0", "Apache",
             "BSD", "MIT", "Expat", "Artistic", "ISC", "Zlib", "OFL", "public-domain")


def deb_version(deb: Path) -> str:
    """``Version`` field of a ``.deb``."""
    res = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"],
                         capture_output=True, text=True, check=False)
    return res.stdout.strip() or "unknown"


def licence_names(copyright_text: str) -> list[str]:
    """Summarise a Debian copyright file into licence family names.

    Combines DEP-5 ``License:`` fields with well-known licence phrases found
    anywhere in the text (for free-form copyright files).
    """
    names: set[str] = set()
    for field in _LICENSE_FIELD.findall(copyright_text):
        for part in re.split(r"\s+(?:or|and)\s+|\s*[|,;]\s*", field):
            family = _family(re.sub(r"^GNU\s+", "", part.strip(), flags=re.IGNORECASE))
            if family:
                names.add(family)
    for phrase, short in _KEYWORDS:
        if re.search(r"\b" + re.escape(phrase) + r"\b", copyright_text, re.IGNORECASE):
            names.add(short)
    if "CC" in names and any(n.startswith("CC-") or n == "CC0" for n in names):
        names.discard("CC")
    return sorted(names) or ["see copyright file"]


def _family(token: str) -> str:
    upper = token.upper().replace("_", "-")
    for family in _FAMILIES:
        if upper.startswith(family.upper()):
            return family
    return ""


def copyright_file(root: Path, package: str) -> Path | None:
    """The package's copyright file inside an extracted tree, if present."""
    path = root / "usr/share/doc" / package / "copyright"
    if path.exists():
        return path
    found = sorted(root.glob("usr/share/doc/*/copyright"))
    return found[0] if found else None


def notice_line(package: str, deb: Path, root: Path) -> str:
    """One NOTICE entry: package, version, licences."""
    cfile = copyright_file(root, package)
    text = cfile.read_text(encoding="utf-8", errors="replace") if cfile else ""
    return f"{package}\t{deb_version(deb)}\t{', '.join(licence_names(text))}"
