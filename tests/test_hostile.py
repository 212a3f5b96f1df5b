"""Hostile markup in uploaded files, beyond tests/test_security.py's: markup that costs far more than its bytes, DTDs
in every XML-like format, zip entries that are not plain files, and entities in HTML text.

Each case was probed as a hostile user would, against a server that took it (or took gigabytes to refuse it).
"""

from __future__ import annotations

import asyncio
import io
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.documents.archive import Entry, Limits, read_zip, write_zip
from server.documents.office import read_docx
from server.documents.workers import FileWorkers
from server.errors import EmptyText, InvalidDocument, Overloaded, PayloadTooLarge
from tests.helpers import PARAGRAPH, W, make_epub, server_settings, word, zipped

NODES = 5000  # the markup budget of the test server: elements and attributes of one file


@pytest.fixture(scope="module")
def client(tiny_model_dir: Path) -> Iterator[TestClient]:
    settings = server_settings(tiny_model_dir, max_file_nodes=NODES, scheduler_process=False)
    with TestClient(create_app(settings)) as c:
        yield c


def post(client: TestClient, name: str, data: bytes) -> tuple[int, str]:
    r = client.post("/translate_file", files={"file": (name, data)}, data={"source": "en", "target": "pt"})
    return r.status_code, r.json().get("error_type", "")


def empty_paragraphs(count: int) -> str:
    """The issue's document in small: nothing but empty paragraphs, a few bytes each, a node each once parsed."""
    return f'<w:document {W}><w:body>{"<w:p/>" * count}</w:body></w:document>'


# --- markup that costs more than its bytes ------------------------------------------------------------------

def test_a_document_of_empty_paragraphs_is_refused_by_its_markup(client: TestClient) -> None:
    """Before: parsed whole (60 MiB of `<w:p/>`: 1.3 GB, 20-30 s), then 400 for having no text."""
    assert post(client, "empty.docx", word(empty_paragraphs(4 * NODES))) == (413, "payload_too_large")


def test_one_element_with_thousands_of_attributes_is_refused(client: TestClient) -> None:
    attributes = " ".join(f'a{i}=""' for i in range(2 * NODES))
    document = PARAGRAPH.replace("<w:p>", f"<w:p {attributes}>")
    assert post(client, "attributes.docx", word(document)) == (413, "payload_too_large")


def test_the_budget_is_for_the_whole_file(client: TestClient) -> None:
    """Parts each within the budget, together over it (headers, footers...)."""
    parts = {f"word/header{i}.xml": empty_paragraphs(NODES // 3) for i in range(4)}
    assert post(client, "headers.docx", word(PARAGRAPH, **parts)) == (413, "payload_too_large")


def test_html_pages_count_against_the_budget(client: TestClient) -> None:
    page = "<p>Open the file.</p>" + "<b></b>" * NODES
    assert post(client, "tags.html", page.encode()) == (413, "payload_too_large")
    assert post(client, "tags.epub", make_epub(page)) == (413, "payload_too_large")


def test_a_document_within_the_budget_is_translated(client: TestClient) -> None:
    assert post(client, "fine.docx", word(PARAGRAPH.replace("<w:body>", "<w:body>" + "<w:p/>" * 100)))[0] == 200


def test_the_default_budget_refuses_the_issue_file_in_its_shape() -> None:
    """With the defaults, a part of a million and a half empty paragraphs (9 MB, 20 KB zipped) is refused before
    libxml2 builds a node."""
    data = word(empty_paragraphs(1_500_000))
    assert len(data) < 100_000
    with pytest.raises(PayloadTooLarge):
        read_docx(data, "empty.docx", Limits(64 << 20, 2000))


def test_files_read_at_once_are_bounded() -> None:
    """One worker, one file waiting: a third file at that moment is refused (429), the others are read in turn."""
    heavy = word(empty_paragraphs(200_000))

    async def read_three() -> list[object]:
        workers = FileWorkers(1, 1, retry_after=2)
        reads = [workers.read(heavy, "heavy.docx", Limits(64 << 20, 2000), 1000, 100, None) for _ in range(3)]
        return await asyncio.gather(*reads, return_exceptions=True)

    results = asyncio.run(read_three())
    assert [type(r) for r in results] == [EmptyText, EmptyText, Overloaded]


# --- DTDs and entities in every XML-like format ---------------------------------------------------------------

XXE = '<!DOCTYPE html [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>'


@pytest.mark.parametrize("name, data", [
    ("page.html", f"{XXE}<html><body><p>Open &xxe; the file.</p></body></html>".encode()),
    ("book.epub", make_epub(f'<?xml version="1.0"?>{XXE}<html xmlns="http://www.w3.org/1999/xhtml"><body>'
                            '<p>Open &xxe; the file.</p></body></html>')),
    ("element.docx", word(f"<!DOCTYPE w:document [<!ELEMENT w:document ANY>]>{PARAGRAPH}")),
    ("attributes.docx", word(f'<!DOCTYPE w:document [<!ATTLIST w:p w:x CDATA "y">]>{PARAGRAPH}')),
    ("units.xliff", b'<?xml version="1.0"?><!DOCTYPE xliff [<!ELEMENT xliff ANY>]><xliff version="1.2" '
                    b'xmlns="urn:oasis:names:tc:xliff:document:1.2"><file source-language="en" datatype="plaintext" '
                    b'original="a"><body><trans-unit id="1"><source>Open the file.</source></trans-unit></body>'
                    b'</file></xliff>'),
])
def test_document_types_with_declarations_are_refused(client: TestClient, name: str, data: bytes) -> None:
    """Before: an HTML page or EPUB page came back still declaring its entity (as malformed XML); Office and XLIFF
    files were refused only for entities, not for other declarations."""
    assert post(client, name, data) == (400, "invalid_document")


def test_a_public_document_type_is_still_taken(client: TestClient) -> None:
    page = ('<?xml version="1.0"?><!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.1//EN" '
            '"http://www.w3.org/TR/xhtml11/DTD/xhtml11.dtd"><html xmlns="http://www.w3.org/1999/xhtml"><body>'
            '<p>Open the file.</p></body></html>')
    assert post(client, "book.epub", make_epub(page))[0] == 200


# --- zip entries that are not plain files --------------------------------------------------------------------

def with_mode(data: bytes, name: str, mode: int, content: bytes) -> bytes:
    """The archive with one more entry whose Unix mode (file type and permissions) is `mode`."""
    out = io.BytesIO(data)
    with zipfile.ZipFile(out, "a") as z:
        info = zipfile.ZipInfo(name)
        info.external_attr = mode << 16
        z.writestr(info, content)
    return out.getvalue()


@pytest.mark.parametrize("mode", [stat.S_IFLNK | 0o777, stat.S_IFCHR | 0o666, stat.S_IFIFO | 0o644])
def test_links_and_special_entries_are_refused(client: TestClient, mode: int) -> None:
    """Before: a symbolic link to /etc/passwd came back as a symbolic link in the translated file."""
    data = with_mode(word(PARAGRAPH), "word/media/link", mode, b"/etc/passwd")
    assert post(client, "link.docx", data) == (400, "invalid_document")
    with pytest.raises(InvalidDocument):
        read_zip(data, "link.docx", Limits(1 << 20, 50))


def test_entries_are_written_as_plain_files() -> None:
    """Whatever a reader hands back: no link, no set-user-ID bit, permissions kept."""
    entries = [Entry(zipfile.ZipInfo("a"), b"x"), Entry(zipfile.ZipInfo("b"), b"y"), Entry(zipfile.ZipInfo("c/"), b"")]
    entries[0].info.external_attr = (stat.S_IFLNK | 0o777) << 16
    entries[1].info.external_attr = (stat.S_IFREG | stat.S_ISUID | 0o755) << 16
    entries[2].info.external_attr = (stat.S_IFDIR | 0o755) << 16 | 0x10
    with zipfile.ZipFile(io.BytesIO(write_zip(entries))) as z:
        modes = [info.external_attr >> 16 for info in z.infolist()]
    assert modes == [stat.S_IFREG | 0o777, stat.S_IFREG | 0o755, stat.S_IFDIR | 0o755]


def test_zipped_helper_entries_stay_taken(client: TestClient) -> None:
    """Archives made without Unix modes (as on Windows) and with plain files' modes are read as before."""
    data = with_mode(zipped({"[Content_Types].xml": "<Types/>", "word/document.xml": PARAGRAPH}), "word/x.bin",
                     stat.S_IFREG | 0o644, b"\0")
    assert post(client, "plain.docx", data)[0] == 200


# --- uploads without a key, with keys on -------------------------------------------------------------------------

KEY = "alpha"


@pytest.fixture(scope="module")
def keyed(tiny_model_dir: Path) -> Iterator[TestClient]:
    settings = server_settings(tiny_model_dir, api_keys=[KEY], max_file_bytes=12 << 20, scheduler_process=False)
    with TestClient(create_app(settings)) as c:
        yield c


def send_in_chunks(client: TestClient, request: httpx.Request, chunk: int = 64 * 1024) -> tuple[int, int, int]:
    """Send the request to the app a chunk at a time, as a socket would; (status, bytes the app read, bytes in all)."""
    body = request.read()
    read = 0
    sent: list[dict[str, Any]] = []
    scope = {"type": "http", "http_version": "1.1", "method": "POST", "scheme": "http", "path": request.url.path,
             "raw_path": request.url.raw_path, "query_string": request.url.query, "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in request.headers.items()],
             "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}

    async def receive() -> dict[str, Any]:
        nonlocal read
        if read < len(body):
            part = body[read:read + chunk]
            read += len(part)
            return {"type": "http.request", "body": part, "more_body": read < len(body)}
        await asyncio.sleep(3600)  # the client waits for its answer
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    app: Any = client.app

    async def call() -> None:
        await app(scope, receive, send)

    client.portal.call(call)  # type: ignore[union-attr]
    return next(m["status"] for m in sent if m["type"] == "http.response.start"), read, len(body)


def big_page(size: int) -> bytes:
    """An HTML page of `size` bytes, nearly all of them a comment: one sentence to translate."""
    return b"<p>Open the file.</p><!--" + b"x" * size + b"-->"


def upload_request(fields: dict[str, str], size: int, key_first: bool = False) -> httpx.Request:
    files: list[tuple[str, Any]] = [("file", ("big.html", big_page(size)))]
    items = [(k, (None, v)) for k, v in fields.items()]
    return httpx.Request("POST", "http://testserver/translate_file", files=items + files if key_first
                         else files + items)


def test_an_upload_without_a_key_is_refused_before_it_is_read(keyed: TestClient) -> None:
    """Before: all 10 MB were read, then 401."""
    status, read, size = send_in_chunks(keyed, upload_request({"target": "pt"}, 10 << 20))
    assert status == 401
    assert read < size // 4


def test_a_wrong_key_before_the_file_is_refused_at_once(keyed: TestClient) -> None:
    status, read, size = send_in_chunks(keyed, upload_request({"api_key": "wrong", "target": "pt"}, 10 << 20,
                                                               key_first=True))
    assert status == 403
    assert read < size // 4


def test_keys_still_reach_an_upload_wherever_they_are(keyed: TestClient) -> None:
    """In a field after the file (LibreTranslate's page, for files up to max_body_bytes), before it, in the
    Authorization header or in the query string."""
    small = {"file": ("a.txt", b"Open the file.")}
    assert keyed.post("/translate_file", files=small, data={"target": "pt", "api_key": KEY}).status_code == 200
    assert send_in_chunks(keyed, upload_request({"api_key": KEY, "target": "pt"}, 2 << 20, key_first=True))[0] == 200
    assert keyed.post("/translate_file", files={"file": ("big.html", big_page(2 << 20))}, data={"target": "pt"},
                      headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert keyed.post("/translate_file", params={"api_key": KEY}, files=small, data={"target": "pt"}).status_code == 200
