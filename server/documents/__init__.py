"""Documents for POST /translate_file: the formats taken, found by the file's extension, and read into texts.

Every reader turns a file into texts for the server's HTML path (one per paragraph, cue, or page) and a function
that builds the translated file from their translations; `server/routes/files.py` translates the texts as one
request. Readers run in a worker thread and raise only TolkErrors (400, 413) for files they cannot take.
"""

from __future__ import annotations

from dataclasses import dataclass

from server.documents.archive import Limits
from server.documents.document import Document, Reader
from server.documents.epub import read_epub
from server.documents.gettext import read_po
from server.documents.office import read_docx, read_odp, read_odt, read_pptx
from server.documents.plain import read_html, read_txt
from server.documents.subtitles import read_srt, read_vtt
from server.documents.xliff import read_xliff
from server.errors import UnsupportedFormat

__all__ = ["FORMATS", "Document", "Format", "Limits", "extensions", "find_format"]


@dataclass(frozen=True)
class Format:
    extensions: tuple[str, ...]  # lower case, with the dot
    media_type: str  # of the translated file
    read: Reader


FORMATS = (
    Format((".txt",), "text/plain; charset=utf-8", read_txt),
    Format((".html", ".htm"), "text/html; charset=utf-8", read_html),
    Format((".docx",), "application/vnd.openxmlformats-officedocument.wordprocessingml.document", read_docx),
    Format((".pptx",), "application/vnd.openxmlformats-officedocument.presentationml.presentation", read_pptx),
    Format((".odt",), "application/vnd.oasis.opendocument.text", read_odt),
    Format((".odp",), "application/vnd.oasis.opendocument.presentation", read_odp),
    Format((".epub",), "application/epub+zip", read_epub),
    Format((".srt",), "application/x-subrip; charset=utf-8", read_srt),
    Format((".vtt",), "text/vtt; charset=utf-8", read_vtt),
    Format((".po", ".pot"), "text/x-gettext-translation; charset=utf-8", read_po),
    Format((".xliff", ".xlf"), "application/xliff+xml", read_xliff),
)


def extensions() -> list[str]:
    """Every extension taken, as LibreTranslate lists them in `supportedFilesFormat`."""
    return [ext for f in FORMATS for ext in f.extensions]


def find_format(filename: str) -> tuple[Format, str]:
    """The format of a file by its extension (any case), and that extension; 400 for one not taken."""
    ext = "." + filename.rsplit(".", 1)[-1].lower() if "." in filename else ""
    for f in FORMATS:
        if ext in f.extensions:
            return f, ext
    raise UnsupportedFormat(f"file format not supported: {ext or 'no extension'}; this server takes "
                            f"{', '.join(extensions())}")
