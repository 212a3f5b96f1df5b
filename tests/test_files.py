"""File translation: POST /translate_file and GET /download_file, every format, on the tiny model.

Documents are made here with python-docx, python-pptx and odfpy (EPUB and subtitles by hand). Every paragraph, cell,
slide text and cue of a translated file must be exactly what POST /translate answers for its text, with its
formatting (runs, spans, tags, timings) where it was. Hostile files are in tests/test_security.py.
"""

from __future__ import annotations

import io
import re
import time
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docx
import pptx
import pytest
from fastapi.testclient import TestClient
from lxml import etree
from odf import opendocument, teletype
from odf import text as odf_text
from odf.draw import Frame, Page, TextBox
from odf.style import MasterPage, PageLayout, Style, TextProperties

from server.app import create_app
from server.documents.store import FileStore
from server.errors import NotFound, PayloadTooLarge
from tests.helpers import CHAPTER, URL, make_docx, make_epub, server_settings, translate_file, upload


@pytest.fixture(scope="module")
def client(tiny_model_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(server_settings(tiny_model_dir))) as c:
        yield c


def translate(client: TestClient, q: str, fmt: str = "text") -> str:
    r = client.post("/translate", json={"q": q, "source": "en", "target": "pt", "format": fmt})
    assert r.status_code == 200, r.text
    text: str = r.json()["translatedText"]
    return text


# --- text, HTML ---------------------------------------------------------------------------------------------

def test_txt_is_translated_as_one_text(client: TestClient) -> None:
    text = "Open the file.\n\n  Save changes before closing. Click here to continue.\r\nSelect all & copy <paste>.\n"
    out = translate_file(client, "notes.txt", text.encode(), "text/plain; charset=utf-8")
    assert out.decode() == translate(client, text)
    bom = translate_file(client, "bom.txt", b"\xef\xbb\xbf" + text.encode(), "text/plain; charset=utf-8")
    assert bom == b"\xef\xbb\xbf" + out  # a byte order mark stays


def test_html_is_translated_as_translate_does_html(client: TestClient) -> None:
    page = ('<!DOCTYPE html>\n<html><head><title>Open the file.</title><style>p { color: red }</style></head>\n'
            '<body><p class="x">Save changes <b>before closing</b> the window.</p>\n'
            '<script>var s = "Do not translate";</script><p>Click here &amp; continue.</p></body></html>\n')
    out = translate_file(client, "page.html", page.encode(), "text/html; charset=utf-8").decode()
    assert out == translate(client, page, "html")
    assert re.findall(r"<[^>]*>", out) == re.findall(r"<[^>]*>", page)  # every tag, in order
    assert 'var s = "Do not translate";' in out
    assert translate_file(client, "page.htm", page.encode(), "text/html; charset=utf-8").decode() == out


# --- Word, PowerPoint ---------------------------------------------------------------------------------------


def test_docx_paragraphs_runs_tables_and_headers(client: TestClient) -> None:
    out = docx.Document(io.BytesIO(translate_file(
        client, "report.docx", make_docx(), "application/vnd.openxmlformats-officedocument.wordprocessingml.document")))
    heading, styled, split, tabbed = out.paragraphs
    assert heading.text == translate(client, "Open the file.") and heading.style.name == "Heading 1"
    runs = [(r.text, r.bold, r.italic) for r in styled.runs]
    assert runs == [(translate(client, "Save changes "), None, None), (translate(client, "before closing"), True, None),
                    (translate(client, " the window"), None, True), (translate(client, "."), None, None)]
    assert split.text == translate(client, "Click here to continue.")
    assert split.text != translate(client, "Click here ") + translate(client, "to continue.")  # not run by run
    assert [r.text for r in split.runs] == [split.text, ""]
    assert tabbed.text == f"{translate(client, 'Disk full:')}\t{translate(client, 'select all')}"
    cells = [c.text for c in out.tables[0]._cells]
    assert cells == [translate(client, t) for t in ["Error while reading.", "Copy.", "Paste.", "Undo."]]
    assert out.sections[0].header.paragraphs[0].text == translate(client, "Translation server.")


NS = {"w": "http://schemas.openxmlformats.org/wordprocessingml/2006/main",
      "r": "http://schemas.openxmlformats.org/officeDocument/2006/relationships",
      "wp": "http://schemas.openxmlformats.org/drawingml/2006/wordprocessingDrawing",
      "a": "http://schemas.openxmlformats.org/drawingml/2006/main",
      "wps": "http://schemas.microsoft.com/office/word/2010/wordprocessingShape"}
DECLARE = " ".join(f'xmlns:{k}="{v}"' for k, v in NS.items())
BODY = (f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\r\n<w:document {DECLARE}><w:body>'
        '<w:p><w:r><w:t xml:space="preserve">Open </w:t></w:r><w:hyperlink r:id="rId9"><w:r><w:rPr>'
        '<w:rStyle w:val="Hyperlink"/></w:rPr><w:t>the file</w:t></w:r></w:hyperlink><w:r><w:t>.</w:t></w:r></w:p>'
        '<w:p><w:r><w:t>Save all.</w:t></w:r><w:r><w:drawing><wp:inline><a:graphic><a:graphicData><wps:wsp>'
        '<wps:txbx><w:txbxContent><w:p><w:r><w:t>Click here.</w:t></w:r></w:p></w:txbxContent></wps:txbx>'
        '</wps:wsp></a:graphicData></a:graphic></wp:inline></w:drawing></w:r></w:p>'
        '<w:p><w:bookmarkStart w:id="0" w:name="b"/><w:r><w:t>Undo</w:t></w:r><w:bookmarkEnd w:id="0"/><w:r>'
        '<w:footnoteReference w:id="1"/></w:r><w:del><w:r><w:delText>deleted words</w:delText></w:r></w:del></w:p>'
        '</w:body></w:document>')
NOTES = (f'<w:footnotes {DECLARE}><w:footnote w:id="1"><w:p><w:r><w:t>Select all.</w:t></w:r></w:p></w:footnote>'
         '</w:footnotes>')


def test_docx_hyperlinks_text_boxes_footnotes_and_revisions(client: TestClient) -> None:
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("word/document.xml", BODY)
        z.writestr("word/footnotes.xml", NOTES)
    out = translate_file(client, "parts.docx", data.getvalue(),
                         "application/vnd.openxmlformats-officedocument.wordprocessingml.document")
    with zipfile.ZipFile(io.BytesIO(out)) as z:
        body, notes = z.read("word/document.xml"), z.read("word/footnotes.xml")
    assert body.startswith(b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\r\n<w:document')
    tree = etree.fromstring(body)
    link, box, undo = tree.findall("w:body/w:p", NS)
    assert [t.text for t in link.iterfind(".//w:t", NS)] == [translate(client, t) for t in ["Open ", "the file", "."]]
    assert link.find("w:hyperlink/w:r/w:t", NS).text == translate(client, "the file")  # still the link's text
    assert box.find("w:r/w:t", NS).text == translate(client, "Save all.")
    assert box.find(".//w:txbxContent/w:p/w:r/w:t", NS).text == translate(client, "Click here.")
    assert undo.find("w:r/w:t", NS).text == translate(client, "Undo")
    assert undo.find("w:r/w:footnoteReference", NS) is not None
    assert undo.find(".//w:delText", NS).text == "deleted words"  # deleted text is not translated
    assert etree.fromstring(notes).find(".//w:t", NS).text == translate(client, "Select all.")


def test_pptx_slides_tables_and_notes(client: TestClient) -> None:
    prs = pptx.Presentation()
    slide = prs.slides.add_slide(prs.slide_layouts[1])
    slide.shapes.title.text = "Open the file."
    body = slide.placeholders[1].text_frame
    body.text = "Save changes before closing."
    p = body.add_paragraph()
    p.add_run().text = "Click "
    bold = p.add_run()
    bold.text = "here"
    bold.font.bold = True
    table = slide.shapes.add_table(1, 2, 0, 0, 100, 100).table
    table.cell(0, 0).text = "Select all."
    slide.notes_slide.notes_text_frame.text = "Error while reading disk."
    data = io.BytesIO()
    prs.save(data)
    out = pptx.Presentation(io.BytesIO(translate_file(
        client, "deck.pptx", data.getvalue(),
        "application/vnd.openxmlformats-officedocument.presentationml.presentation")))
    slide = out.slides[0]
    assert slide.shapes.title.text == translate(client, "Open the file.")
    first, second = slide.placeholders[1].text_frame.paragraphs
    assert first.text == translate(client, "Save changes before closing.")
    assert [(r.text, r.font.bold) for r in second.runs] == [(translate(client, "Click "), None),
                                                             (translate(client, "here"), True)]
    table = next(s for s in slide.shapes if s.has_table).table
    assert table.cell(0, 0).text == translate(client, "Select all.")
    assert slide.notes_slide.notes_text_frame.text == translate(client, "Error while reading disk.")


# --- OpenDocument -------------------------------------------------------------------------------------------

def test_odt_paragraphs_and_spans(client: TestClient) -> None:
    doc = opendocument.OpenDocumentText()
    bold = Style(name="Bold", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    doc.automaticstyles.addElement(bold)
    doc.text.addElement(odf_text.H(outlinelevel=1, text="Open the file."))
    p = odf_text.P(text="Save changes ")
    p.addElement(odf_text.Span(stylename=bold, text="before closing"))
    p.addText(" the window.")
    doc.text.addElement(p)
    doc.text.addElement(odf_text.P(text="Click here to continue."))
    data = io.BytesIO()
    doc.write(data)
    out = opendocument.load(io.BytesIO(translate_file(client, "letter.odt", data.getvalue(),
                                                      "application/vnd.oasis.opendocument.text")))
    (heading,) = out.getElementsByType(odf_text.H)
    assert teletype.extractText(heading) == translate(client, "Open the file.")
    styled, plain = out.getElementsByType(odf_text.P)
    (span,) = styled.getElementsByType(odf_text.Span)
    assert span.getAttribute("stylename") == "Bold"
    assert teletype.extractText(span) == translate(client, "before closing")
    assert teletype.extractText(styled) == "".join(translate(client, t)
                                                   for t in ["Save changes ", "before closing", " the window."])
    assert teletype.extractText(plain) == translate(client, "Click here to continue.")
    with zipfile.ZipFile(io.BytesIO(data.getvalue())) as z:
        assert z.infolist()[0].filename == "mimetype"


def test_odp_text_boxes(client: TestClient) -> None:
    doc = opendocument.OpenDocumentPresentation()
    layout = PageLayout(name="Layout")
    doc.automaticstyles.addElement(layout)
    master = MasterPage(name="Default", pagelayoutname=layout)
    doc.masterstyles.addElement(master)
    page = Page(masterpagename=master)
    doc.presentation.addElement(page)
    frame = Frame(width="20cm", height="3cm", x="1cm", y="1cm")
    page.addElement(frame)
    box = TextBox()
    frame.addElement(box)
    box.addElement(odf_text.P(text="Open the file."))
    box.addElement(odf_text.P(text="Save all."))
    data = io.BytesIO()
    doc.write(data)
    out = translate_file(client, "slides.odp", data.getvalue(), "application/vnd.oasis.opendocument.presentation")
    with zipfile.ZipFile(io.BytesIO(out)) as z:
        first = z.infolist()[0]
        assert (first.filename, first.compress_type) == ("mimetype", zipfile.ZIP_STORED)  # as ODF requires
    texts = [teletype.extractText(p) for p in opendocument.load(io.BytesIO(out)).getElementsByType(odf_text.P)]
    assert texts == [translate(client, "Open the file."), translate(client, "Save all.")]


# --- EPUB ---------------------------------------------------------------------------------------------------


def test_epub_pages_title_and_table_of_contents(client: TestClient) -> None:
    out = translate_file(client, "book.epub", make_epub(), "application/epub+zip")
    with zipfile.ZipFile(io.BytesIO(out)) as z:
        first = z.infolist()[0]
        assert (first.filename, first.compress_type) == ("mimetype", zipfile.ZIP_STORED)
        assert z.read("mimetype") == b"application/epub+zip"
        assert z.read("OEBPS/ch1.xhtml").decode() == translate(client, CHAPTER, "html")
        assert z.read("OEBPS/cover.png") == b"\x89PNG\r\n\x1a\n\x00\x00binary"
        opf, ncx = z.read("OEBPS/content.opf").decode(), z.read("OEBPS/toc.ncx").decode()
    assert f"<dc:title>{translate(client, 'Translation server')}</dc:title>" in opf
    assert "<dc:language>en</dc:language>" in opf and "urn:uuid:1" in opf  # metadata that is not prose stays
    assert f"<text>{translate(client, 'Open settings')}</text>" in ncx


# --- subtitles ----------------------------------------------------------------------------------------------

SRT = """1
00:00:01,000 --> 00:00:04,000
Open the file
before closing the window.

2
00:00:05,000 --> 00:00:07,500
- Save changes.
- Click here.

3
00:00:08,000 --> 00:00:09,000
<i>Select all.</i>
"""


def cues(text: str) -> list[tuple[list[str], str]]:
    """(lines before the text, the text) of each block."""
    found = []
    for block in text.strip().split("\n\n"):
        lines = block.split("\n")
        timing = next(i for i, line in enumerate(lines) if "-->" in line)
        found.append((lines[: timing + 1], "\n".join(lines[timing + 1:])))
    return found


def test_srt_keeps_numbers_and_timings(client: TestClient) -> None:
    out = translate_file(client, "film.srt", SRT.encode(), "application/x-subrip; charset=utf-8").decode()
    (head1, text1), (head2, text2), (head3, text3) = cues(out)
    assert [head1, head2, head3] == [head for head, _ in cues(SRT)]
    # lines that continue one another are translated as one sentence, then wrapped into as many lines
    assert text1.replace("\n", " ") == translate(client, "Open the file before closing the window.")
    assert len(text1.split("\n")) <= 2
    assert text2 == translate(client, "- Save changes.\n- Click here.")  # dialogue keeps its lines
    assert text3 == f"<i>{translate(client, 'Select all.')}</i>"
    assert out.endswith("\n") and not out.endswith("\n\n")


def test_a_malformed_cue_is_refused_naming_its_line_and_a_missing_blank_line_forgiven(client: TestClient) -> None:
    bad = SRT.replace("00:00:05,000 --> 00:00:07,500", "00:00:05,000 -> 00:00:07,500")
    r = client.post("/translate_file", files={"file": ("film.srt", bad.encode())}, data={"target": "pt"})
    assert (r.status_code, r.json()["error_type"]) == (400, "invalid_document")
    message = r.json()["error"]
    assert "block at line 6 has no timing line" in message and "00:00:05,000 -> 00:00:07,500" in message
    glued = SRT.replace("window.\n\n2\n", "window.\n2\n")  # the blank line before cue 2 missing
    out = translate_file(client, "film.srt", glued.encode(), "application/x-subrip; charset=utf-8").decode()
    assert "\n2\n00:00:05,000 --> 00:00:07,500\n" in out
    dialogue = translate(client, "- Save changes.\n- Click here.")
    assert out.split("00:00:05,000 --> 00:00:07,500\n")[1].startswith(dialogue)


def test_vtt_keeps_header_notes_settings_and_tags(client: TestClient) -> None:
    vtt = ("WEBVTT - a film\r\n\r\nNOTE Save this note.\r\n\r\nintro\r\n00:01.000 --> 00:04.000 align:start "
           "line:0\r\n<v Bob>Open the file &amp; save.</v>\r\n\r\n00:05.000 --> 00:06.000\r\nClick here.\r\n")
    out = translate_file(client, "film.vtt", vtt.encode(), "text/vtt; charset=utf-8").decode()
    blocks = out.split("\r\n\r\n")
    assert blocks[:2] == ["WEBVTT - a film", "NOTE Save this note."]
    assert blocks[2].split("\r\n")[:2] == ["intro", "00:01.000 --> 00:04.000 align:start line:0"]
    expected = translate(client, "Open the file & save.").replace("&", "&amp;").replace("<", "&lt;")
    assert blocks[2].split("\r\n")[2] == f"<v Bob>{expected}</v>"
    assert blocks[3] == f"00:05.000 --> 00:06.000\r\n{translate(client, 'Click here.')}\r\n"


# --- the API around it --------------------------------------------------------------------------------------

def test_a_libretranslate_page_upload(client: TestClient) -> None:
    """Exactly what LibreTranslate's page sends (its FormData: file, source, target, an empty api_key), then the
    link it opens."""
    r = client.post("/translate_file", files={"file": ("Résumé final.txt", b"Open the file.", "text/plain")},
                    data={"source": "auto", "target": "pt", "api_key": ""})
    assert r.status_code == 200, r.text
    assert r.json()["detectedLanguage"]["language"] == "en" and r.json()["detectedLanguage"]["confidence"] > 90
    url = r.json()["translatedFileUrl"]
    assert URL.fullmatch(url) and url.endswith(".Resume_final_pt.txt")
    r = client.get(url)
    assert r.status_code == 200 and r.text == translate(client, "Open the file.")
    assert r.headers["content-disposition"] == 'attachment; filename="Resume_final_pt.txt"'


def test_target_may_be_omitted_with_one_model(client: TestClient) -> None:
    r = client.post("/translate_file", files={"file": ("a.txt", b"Open the file.")})
    assert r.status_code == 200, r.text
    assert r.json()["translatedFileUrl"].endswith(".a_pt.txt")


def test_unknown_and_wrong_downloads_are_404(client: TestClient) -> None:
    url = upload(client, "a.txt", b"Save all.")["translatedFileUrl"]
    file_id = url.split("/")[-1].split(".")[0]
    for path in (f"/download_file/{file_id}.b_pt.txt", f"/download_file/{file_id}", "/download_file/nothing",
                 "/download_file/00000000-0000-4000-8000-000000000000.a_pt.txt", "/download_file/..%2F..%2Fetc"):
        r = client.get(path)
        assert r.status_code == 404, path
        assert r.json()["error_type"] == "not_found" and set(r.json()) == {"error", "error_type"}


@pytest.mark.parametrize(("name", "data", "status", "error_type"), [
    ("a.pdf", b"%PDF-1.4", 400, "unsupported_format"),
    ("noextension", b"Open the file.", 400, "unsupported_format"),
    ("empty.txt", b"", 400, "empty_text"),
    ("blank.txt", b" \n\n ", 400, "empty_text"),
    ("markup.html", b"<p> </p><img src=x>", 400, "empty_text"),
    ("film.srt", b"no cues here\n", 400, "invalid_document"),
    ("film.vtt", b"00:01.000 --> 00:02.000\nHello\n", 400, "invalid_document"),
    ("language.txt", b"Open the file.", 400, "unsupported_language"),
])
def test_files_it_cannot_take(client: TestClient, name: str, data: bytes, status: int, error_type: str) -> None:
    fields = {"source": "xx"} if name == "language.txt" else {"source": "en"}
    r = client.post("/translate_file", files={"file": (name, data)}, data=fields)
    assert (r.status_code, r.json()["error_type"]) == (status, error_type), r.text


def test_malformed_requests(client: TestClient) -> None:
    r = client.post("/translate_file", json={"file": "Open the file."})
    assert (r.status_code, r.json()["error_type"]) == (400, "invalid_request")
    r = client.post("/translate_file", data={"source": "en"}, files={"other": ("a.txt", b"x")})
    assert (r.status_code, r.json()["error"]) == (400, "Invalid request: missing file parameter")
    assert client.get("/translate_file").status_code == 405


def test_frontend_settings_list_the_formats(client: TestClient, tiny_model_dir: Path) -> None:
    settings = client.get("/frontend/settings").json()
    assert settings["filesTranslation"] is True
    assert settings["supportedFilesFormat"] == [".txt", ".html", ".htm", ".docx", ".pptx", ".odt", ".odp", ".epub",
                                                ".srt", ".vtt", ".po", ".pot", ".xliff", ".xlf"]
    with TestClient(create_app(server_settings(tiny_model_dir, files=False, scheduler_process=False))) as off:
        settings = off.get("/frontend/settings").json()
        assert (settings["filesTranslation"], settings["supportedFilesFormat"]) == (False, [])
        r = off.post("/translate_file", files={"file": ("a.txt", b"Open the file.")})
        assert r.status_code == 403
        assert r.json() == {"error": "Files translation are disabled on this server.", "error_type": "forbidden"}


def resident_mib() -> float:
    """This process's resident memory now (not its peak)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def test_a_file_is_read_in_a_process_of_its_own(client: TestClient) -> None:
    """While a heavy file is parsed (900,000 empty paragraphs: about 0.9 s and 110 MB in the server's process, as
    it was read before), other requests are answered at once and the server's memory does not move."""
    w = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("word/document.xml", f"<w:document {w}><w:body>{'<w:p/>' * 900_000}</w:body></w:document>")
    heavy = out.getvalue()
    before, most = resident_mib(), 0.0
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.post, "/translate_file", files={"file": ("heavy.docx", heavy)},
                              data={"target": "pt"})
        while not pending.done():
            most = max(most, resident_mib() - before)
            started = time.monotonic()
            assert client.get("/health").status_code == 200
            assert time.monotonic() - started < 0.5
            time.sleep(0.01)
        r = pending.result()
    assert (r.status_code, r.json()["error_type"]) == (400, "empty_text")  # read to its end: no text in it
    assert most < 50


def test_downloads_expire(tiny_model_dir: Path) -> None:
    with TestClient(create_app(server_settings(tiny_model_dir, file_ttl=0.5, scheduler_process=False))) as c:
        url = upload(c, "a.txt", b"Open the file.")["translatedFileUrl"]
        assert c.get(url).status_code == 200
        assert c.get(url).status_code == 200  # as often as asked, until it expires
        time.sleep(0.6)
        r = c.get(url)
        assert (r.status_code, r.json()["error_type"]) == (404, "not_found")
        directory = c.app.state.files.directory  # type: ignore[attr-defined]
        assert list(directory.iterdir()) == []
    assert not directory.exists()  # removed at stop


def test_the_store_keeps_within_its_bound(tmp_path: Path) -> None:
    store = FileStore(ttl=60, max_bytes=2048, parent=tmp_path)
    old = store.put("old.txt", "text/plain", b"a" * 1500)
    new = store.put("new.txt", "text/plain", b"b" * 1000)  # the oldest makes room
    with pytest.raises(NotFound):
        store.get(old, "old.txt")
    assert store.get(new, "new.txt").path.read_bytes() == b"b" * 1000
    with pytest.raises(NotFound):
        store.get(new, "other.txt")  # the id alone does not find it
    with pytest.raises(PayloadTooLarge):
        store.put("huge.txt", "text/plain", b"c" * 2049)
    assert [p.name for p in store.directory.iterdir()] == [new]
    store.close()
    assert not store.directory.exists()


def test_a_file_has_its_own_timeout(tiny_model_dir: Path) -> None:
    """TOLK_FILE_TIMEOUT, not a text request's TOLK_REQUEST_TIMEOUT, bounds a document's translation."""
    text = "Open the file. Save the changes. Close the window.\nPrint the page.\n"
    settings = server_settings(tiny_model_dir, request_timeout=0.001, file_timeout=120)
    with TestClient(create_app(settings)) as c:
        r = c.post("/translate", json={"q": text, "source": "en", "target": "pt"})
        assert r.status_code == 504 and r.json()["error_type"] == "timeout"
        assert upload(c, "notes.txt", text.encode(), source="en", target="pt")["translatedFileUrl"]
