"""The translation page at `/`: its files, then Debian's chromium (headless, driven by Playwright) against a real
server on loopback: the streamed text ends equal to POST /translate, stop cancels the request on the server, errors
are shown, and the phone-sized screenshot is not blank.

Without Playwright or a chromium executable the browser tests are skipped, and the reason is printed.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import time
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from model.decode import DecodeBatch
from model.events import Event
from model.search import steps
from server import batcher
from server.app import create_app
from server.settings import Settings
from tests.helpers import ES, renamed
from tests.live import live_server

ROOT = Path(__file__).resolve().parents[1]
STATIC = ROOT / "server" / "static"
MAX_CHARS = 3000
ROWS = 1  # one cache row: a long text takes many steps, and is stopped early
STEP_DELAY = 0.005  # seconds added to each decoder step where a test must outrun the decoding
# without the background-networking flags a closed network refuses chromium's own connections
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def settings(model_dir: Path) -> Settings:
    # the batcher as a thread of this process, so that a test can slow its steps (test_stop_closes_...)
    return Settings(_env_file=None, models=[model_dir], device="cpu", dtype="float32", threads=1,  # type: ignore[call-arg]
                    max_text_chars=MAX_CHARS, max_batch_rows=ROWS, scheduler_process=False)


# ---------------------------------------------------------------- the files, without a browser


def test_page_and_its_files_are_served_for_offline_use(tiny_model_dir: Path) -> None:
    client = TestClient(create_app(settings(tiny_model_dir)))  # no lifespan: the page needs no model
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    references = re.findall(r'(?:src|href)="([^"]*)"', page.text)
    assert "/static/app.js" in references and "/static/app.css" in references
    assert all(ref.startswith(("/", "#", "data:")) for ref in references), references
    for name, kind in (("app.js", "text/javascript"), ("app.css", "text/css")):
        answer = client.get(f"/static/{name}")
        assert answer.status_code == 200 and answer.headers["content-type"].startswith(kind)
        assert not re.search(r"https?://|@import|url\(", answer.text), f"{name} loads something from elsewhere"
    for missing in ("/static/nothing.js", "/static/..%2Fapp.py", "/static/"):
        answer = client.get(missing)
        assert answer.status_code == 404 and answer.json()["error_type"] == "not_found", missing
    # every label points at a control, so screen readers name each one
    ids = set(re.findall(r'\bid="([^"]+)"', page.text))
    assert set(re.findall(r'<label for="([^"]+)"', page.text)) <= ids


def test_static_files_ship_with_the_package() -> None:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["server"]
    shipped = {p.relative_to(ROOT / "server").as_posix()
               for pattern in patterns for p in (ROOT / "server").glob(pattern)}
    assert {"static/index.html", "static/app.css", "static/app.js"} <= shipped


# ---------------------------------------------------------------- a live server and a browser


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except OSError as exc:
        return getattr(exc, "code", 0), b""


@pytest.fixture(scope="module")
def base_url(tiny_model_dir: Path) -> Iterator[str]:
    with live_server(create_app(settings(tiny_model_dir))) as url:
        yield url


def _skip(config: pytest.Config, reason: str) -> NoReturn:
    """Skip, and say why on the terminal even without -rs: a browser test must never pass unseen."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # a skipped test's captured output is never shown
            reporter.write_line(f"tests/test_page.py SKIPPED: {reason}", yellow=True)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser(pytestconfig: pytest.Config) -> Iterator[Any]:
    """Debian's chromium, headless, through Playwright (its own browser downloads are never used)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _skip(pytestconfig, "playwright is not installed (pip install -e '.[dev]')")
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        _skip(pytestconfig, "no chromium executable on PATH (apt-get install chromium; .ci/run does it as root)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any, base_url: str) -> Iterator[Any]:
    """A fresh page on `/`, once the languages and settings have loaded; fails on any request to another origin."""
    context = browser.new_context(viewport={"width": 1200, "height": 900}, locale="en-US")
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base_url)
    tab = context.new_page()
    tab.set_default_timeout(20_000)
    elsewhere: list[str] = []
    tab.on("request", lambda r: None if r.url.startswith((base_url, "data:")) else elsewhere.append(r.url))
    tab.goto(base_url + "/")
    tab.wait_for_selector("#translate:enabled")  # (no wait_for_function: the page's CSP forbids eval, as it should)
    yield tab
    context.close()
    assert not elsewhere, f"the page loaded from another origin: {elsewhere}"


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _metric(base_url: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of one metric, by their labels."""
    text = _get(base_url + "/metrics")[1].decode()
    return {tuple(sorted(s.labels.items())): s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name}


def _wait_until(condition: Any, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow  # a browser
def test_streams_the_translation_equal_to_post_translate(page: Any, base_url: str) -> None:
    assert page.input_value("#source") == "en" and page.input_value("#target") == "pt"
    assert page.locator("#source option:checked").inner_text() == "English"
    assert page.locator("#target option:checked").inner_text() == "Portuguese"
    assert page.is_disabled("#swap"), "no model translates pt to en"
    assert page.input_value("#beam_size") == "1", "the settings panel holds the model's defaults"

    text = "Save changes before closing. Open the file."
    expected = _post(base_url + "/translate", {"q": text, "source": "en", "target": "pt"})["translatedText"]
    page.click("#text")
    page.keyboard.type(text)
    assert re.fullmatch(rf"{len(text)} / 3,000 characters", page.inner_text("#counter"))
    page.keyboard.press("Control+Enter")
    page.wait_for_selector("#output[data-state=done]")
    assert page.input_value("#output") == expected
    assert int(page.get_attribute("#output", "data-pieces")) >= 2, "the text arrived as token events"
    assert page.inner_text("#status") == "Translation done."
    assert page.is_hidden("#error")

    page.click("#copy")
    page.wait_for_selector("#status:has-text('copied')")
    assert page.evaluate("navigator.clipboard.readText()") == expected


@pytest.mark.slow  # a browser
def test_stop_closes_the_stream_and_frees_the_rows(page: Any, base_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # every decoder step waits a little, so the text cannot end before the stop however fast the machine decodes
    # (the compiled CPU step ran this tiny model's 24,000 steps in seconds, and the stop came too late)
    slowed = []

    def slow_step(batch: DecodeBatch, most: int) -> list[Event]:  # (one step at a time, each slowed)
        slowed.append(batch.n)
        time.sleep(STEP_DELAY)
        return steps(batch, 1)

    monkeypatch.setattr(batcher, "steps", slow_step)
    sentences = 190  # ROWS at a time, each forced to its full length: minutes of decoding, stopped long before
    # distinct sentences: a sentence repeated within a request is decoded once (the translation cache's dedup)
    page.fill("#text", " ".join(f"Open file {i}." for i in range(sentences)))
    page.click("summary")
    page.fill("#max_new_tokens", "128")
    page.fill("#min_new_tokens", "128")  # end-of-sentence is forbidden, so every sentence runs to its length
    finished_before = sum(_metric(base_url, "tolk_generated_tokens_total").values())
    page.click("#translate")
    page.wait_for_selector("#output[data-state=streaming]:not([data-pieces='0'])")  # text while it is generated
    assert page.input_value("#output")
    # (the batcher publishes its gauges at most every STATS_EVERY seconds, so they may trail the first text a little)
    _wait_until(lambda: _metric(base_url, "tolk_kv_cache_rows_used")[(("model", "tiny-en-pt"),)] > 0)
    assert slowed, "the steps were slowed"
    page.click("#stop")
    page.wait_for_selector("#output[data-state=stopped]")
    assert page.inner_text("#status") == "Stopped. The translation so far is kept."
    assert page.is_disabled("#stop") and page.is_hidden("#error")
    shown = page.input_value("#output")

    # the server saw the connection close and cancelled the request: its rows are free long before it could end
    _wait_until(lambda: _metric(base_url, "tolk_kv_cache_rows_used")[(("model", "tiny-en-pt"),)] == 0)
    assert _metric(base_url, "tolk_requests_running")[(("model", "tiny-en-pt"),)] == 0
    finished = sum(_metric(base_url, "tolk_generated_tokens_total").values()) - finished_before
    assert finished < 128 * sentences / 2, "the request ran on after the stop"
    assert page.input_value("#output") == shown, "nothing arrives after the stop"


@pytest.mark.slow  # a browser
def test_errors_are_explained(page: Any) -> None:
    page.fill("#text", "Open the file. " * (MAX_CHARS // 15 + 1))
    assert "over the limit" in page.inner_text("#counter")
    assert page.get_attribute("#text", "aria-invalid") == "true"
    page.click("#translate")
    page.wait_for_selector("#output[data-state=error]")
    message = page.inner_text("[role=alert]")
    assert message.startswith("The text is too long:") and f"the limit is {MAX_CHARS}" in message, message

    page.fill("#text", "Open the file.")
    page.click("summary")
    page.fill("#beam_size", str(ROWS + 2))  # within what the model allows, beyond the rows
    page.click("#translate")
    page.wait_for_selector(f"[role=alert]:has-text('beam_size must be at most {ROWS}')")
    assert page.inner_text("[role=alert]").startswith("A generation setting is not accepted:")
    page.click("#reset")
    page.click("#translate")
    page.wait_for_selector("#output[data-state=done]")
    assert page.is_hidden("[role=alert]"), "a successful translation clears the message"


@pytest.mark.slow  # a browser
def test_a_document_is_translated_and_downloaded(page: Any, base_url: str) -> None:
    text = "Open the file.\nSave changes before closing."
    expected = _post(base_url + "/translate", {"q": text, "source": "en", "target": "pt"})["translatedText"]
    page.wait_for_selector("#files", state="visible")
    assert ".docx" in page.get_attribute("#file", "accept").split(",")
    page.set_input_files("#file", files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": text.encode()}])
    page.click("#translate-file")
    page.wait_for_selector("#file-link", state="visible")
    assert page.inner_text("#file-status") == "notes.txt is translated."
    with page.expect_download() as info:
        page.click("#file-link")
    assert info.value.suggested_filename == "notes_pt.txt"
    assert Path(info.value.path()).read_text() == expected

    page.set_input_files("#file", files=[{"name": "notes.pdf", "mimeType": "application/pdf", "buffer": b"%PDF"}])
    page.click("#translate-file")
    page.wait_for_selector("#file-error", state="visible")
    assert page.inner_text("#file-error").startswith(
        "The server cannot translate this document: file format not supported: .pdf")
    assert page.is_hidden("#file-link")


@pytest.mark.slow  # a browser
def test_detection_is_offered_and_the_detected_language_shown(browser: Any, tiny_model_dir: Path,
                                                               tmp_path: Path) -> None:
    """With two source languages the page offers detection, and says which language it found."""
    dirs = [tiny_model_dir, renamed(tiny_model_dir, tmp_path / "es-pt", "es", "pt")]
    config = settings(tiny_model_dir).model_copy(update={"models": dirs, "scheduler_process": False})
    with live_server(create_app(config)) as url:
        context = browser.new_context(viewport={"width": 1200, "height": 900}, locale="en-US")
        tab = context.new_page()
        tab.set_default_timeout(20_000)
        tab.goto(url + "/")
        tab.wait_for_selector("#translate:enabled")
        assert tab.input_value("#source") == "auto"
        assert tab.locator("#source option:checked").inner_text() == "Detect language"
        assert tab.input_value("#target") == "pt" and tab.is_disabled("#swap")
        tab.fill("#text", ES)
        tab.click("#translate")
        tab.wait_for_selector("#output[data-state=done]")
        expected = _post(url + "/translate", {"q": ES, "source": "auto", "target": "pt"})
        assert tab.input_value("#output") == expected["translatedText"]
        confidence = round(expected["detectedLanguage"]["confidence"])
        assert tab.inner_text("#stats").endswith(f" · detected Spanish ({confidence}%)")
        context.close()


@pytest.mark.slow  # a browser
@pytest.mark.parametrize(("locale", "target"), [("en-US", "pt"), ("pt-BR", "en")])
def test_a_first_visit_opens_on_a_target_the_visitor_wants(browser: Any, tiny_model_dir: Path, tmp_path: Path,
                                                           locale: str, target: str) -> None:
    """en -> pt and pt -> en: the page opens on detection into the language the visitor does not write (by the
    browser's language), remembers the pair chosen, and English sent to English comes back as it is."""
    dirs = [tiny_model_dir, renamed(tiny_model_dir, tmp_path / "pt-en", "pt", "en")]
    config = settings(tiny_model_dir).model_copy(update={"models": dirs, "scheduler_process": False})
    english = "The file could not be opened because the disk is full."
    with live_server(create_app(config)) as url:
        context = browser.new_context(viewport={"width": 1200, "height": 900}, locale=locale)
        tab = context.new_page()
        tab.set_default_timeout(20_000)
        tab.goto(url + "/")
        tab.wait_for_selector("#translate:enabled")
        assert (tab.input_value("#source"), tab.input_value("#target")) == ("auto", target)
        tab.select_option("#target", "en")
        tab.fill("#text", english)
        tab.click("#translate")
        tab.wait_for_selector("#output[data-state=done]")
        assert tab.input_value("#output") == english
        assert _post(url + "/translate", {"q": english, "source": "auto", "target": "en"})["translatedText"] == english
        assert " · detected English (" in tab.inner_text("#stats")
        tab.reload()
        tab.wait_for_selector("#translate:enabled")
        assert (tab.input_value("#source"), tab.input_value("#target")) == ("auto", "en")  # the choice, remembered
        context.close()


@pytest.mark.slow  # a browser
def test_phone_sized_screenshot_is_not_blank(page: Any, tmp_path: Path) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    page.fill("#text", "Save changes before closing.")
    page.click("#translate")
    page.wait_for_selector("#output[data-state=done]")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390, "the page scrolls sideways on a phone"
    shot = tmp_path / "page.png"
    page.screenshot(path=str(shot))
    width, height, colours = png_colours(shot.read_bytes())
    assert (width, height) == (390, 844)
    assert colours > 8, f"the screenshot has {colours} colours"


def png_colours(data: bytes) -> tuple[int, int, int]:
    """Width, height and number of distinct colours of an 8-bit RGB(A) PNG (as Chromium writes them)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    header, idat, pos = b"", b"", 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IHDR":
            header = data[pos + 8:pos + 8 + length]
        elif kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, header
    bpp = 3 if colour_type == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    pixels: set[bytes] = set()
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride) if kind else ():  # undo the row's filter (PNG spec, section 9)
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            else:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        pixels.update(bytes(line[x:x + bpp]) for x in range(0, stride, bpp))
        prev = line
    return width, height, len(pixels)
