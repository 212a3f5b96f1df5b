"""Asynchronous documents (POST /documents, its status and result) and `tolk translate-file`, on the tiny model.

A document translated in the background must come out byte for byte as POST /translate_file makes it; its key,
its owner, the bound on documents at once, expiry and the refusal of hostile files at upload are checked here, and
the command line against a real server (tests/live.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server import cli
from server.app import create_app
from server.routes import documents
from server.routes.files import start_translation
from server.routing import RoutedTranslation
from tests.helpers import hostile_files, server_settings
from tests.live import live_server

SRT = "".join(f"{i}\n00:00:0{i},000 --> 00:00:0{i},900\nOpen the file number {i}. Save it.\n\n" for i in range(1, 8))
TXT = "Open the file.\n\n  Save changes before closing. Click here to continue.\n"


@pytest.fixture(scope="module")
def client(tiny_model_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(server_settings(tiny_model_dir))) as c:
        yield c


def upload(client: TestClient, name: str, data: bytes, **fields: str) -> dict[str, str]:
    r = client.post("/documents", files={"file": (name, data)}, data={"source_lang": "EN", "target_lang": "PT",
                                                                      **fields})
    assert r.status_code == 200, r.text
    handle: dict[str, str] = r.json()
    assert set(handle) == {"document_id", "document_key"}
    return handle


def wait_done(client: TestClient, handle: dict[str, str], timeout: float = 30) -> list[dict[str, Any]]:
    """Every status seen until the document is done (or failed)."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = client.post(f"/documents/{handle['document_id']}", data={"document_key": handle["document_key"]})
        assert r.status_code == 200, r.text
        seen.append(r.json())
        if seen[-1]["status"] in ("done", "error"):
            return seen
        time.sleep(0.05)
    raise AssertionError(f"not done in {timeout} s: {seen[-1]}")


def via_translate_file(client: TestClient, name: str, data: bytes) -> bytes:
    r = client.post("/translate_file", files={"file": (name, data)}, data={"source": "en", "target": "pt"})
    assert r.status_code == 200, r.text
    return client.get(r.json()["translatedFileUrl"]).content


@pytest.mark.parametrize(("name", "data"), [("film.srt", SRT.encode()), ("notes.txt", TXT.encode())])
def test_a_document_comes_out_as_translate_file_makes_it(client: TestClient, name: str, data: bytes) -> None:
    handle = upload(client, name, data)
    seen = wait_done(client, handle)
    last = seen[-1]
    assert last["status"] == "done", last
    assert last["progress"] == 1.0 and last["billed_characters"] > 0 and last["document_id"] == handle["document_id"]
    progress = [s["progress"] for s in seen]
    assert progress == sorted(progress) and all(0 <= p <= 1 for p in progress)
    r = client.post(f"/documents/{handle['document_id']}/result", json={"document_key": handle["document_key"]})
    assert r.status_code == 200, r.text
    stem, ext = name.rsplit(".", 1)
    assert r.headers["content-disposition"] == f'attachment; filename="{stem}_pt.{ext}"'
    assert r.content == via_translate_file(client, name, data)
    # downloaded once, then gone (as DeepL does)
    again = client.post(f"/documents/{handle['document_id']}/result", json={"document_key": handle["document_key"]})
    assert (again.status_code, again.json()["error_type"]) == (404, "not_found")


def test_libretranslate_field_names_and_auto_source(client: TestClient) -> None:
    r = client.post("/documents", files={"file": ("a.txt", TXT.encode())}, data={"target": "pt"})
    assert r.status_code == 200, r.text
    assert wait_done(client, r.json())[-1]["status"] == "done"


def test_wrong_key_and_unknown_id(client: TestClient) -> None:
    handle = upload(client, "a.txt", b"Open the file.")
    r = client.post(f"/documents/{handle['document_id']}", data={"document_key": "not-the-key"})
    assert (r.status_code, r.json()["error_type"]) == (403, "forbidden")
    r = client.post(f"/documents/{handle['document_id']}/result", data={"document_key": "not-the-key"})
    assert r.status_code == 403
    r = client.post("/documents/0f0e4a3c-0000-4000-8000-000000000000", data={"document_key": handle["document_key"]})
    assert (r.status_code, r.json()["error_type"]) == (404, "not_found")
    r = client.post(f"/documents/{handle['document_id']}", json={})
    assert r.status_code == 422  # no document_key at all
    assert wait_done(client, handle)[-1]["status"] == "done"


def test_hostile_files_are_refused_at_upload(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Every hostile file of tests/test_security.py gets its 4xx from the upload itself, never a document id."""
    secret = tmp_path / "secret.txt"
    secret.write_text("Zanzibarquux private key")
    settings = server_settings(tiny_model_dir, max_file_bytes=64 * 1024, max_file_chars=1000,
                               max_file_expanded_bytes=1 << 20, max_file_entries=50, scheduler_process=False)
    with TestClient(create_app(settings)) as c:
        for case, (name, data, status, error_type) in hostile_files(secret).items():
            r = c.post("/documents", files={"file": (name, data)}, data={"source_lang": "en", "target_lang": "pt"})
            assert (r.status_code, r.json()["error_type"]) == (status, error_type), (case, r.text)
            assert "Zanzibarquux" not in r.text
        r = c.post("/documents", files={"file": ("a.pdf", b"%PDF-1.4")}, data={"target_lang": "pt"})
        assert (r.status_code, r.json()["error_type"]) == (400, "unsupported_format")
        assert c.app.state.documents.running() == 0  # type: ignore[attr-defined]


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Documents wait before their sentences are queued until the event is set."""
    release = threading.Event()

    async def waiting(prepared: Any) -> RoutedTranslation:
        while not release.is_set():
            await asyncio.sleep(0.01)
        return await start_translation(prepared)

    monkeypatch.setattr(documents, "start_translation", waiting)
    yield release
    release.set()


def test_the_number_of_documents_at_once_is_bounded(tiny_model_dir: Path, held: threading.Event) -> None:
    settings = server_settings(tiny_model_dir, max_document_jobs=2, scheduler_process=False)
    with TestClient(create_app(settings)) as c:
        first = [upload(c, f"{i}.txt", b"Open the file.") for i in range(2)]
        r = c.post("/documents", files={"file": ("3.txt", b"Open the file.")}, data={"target_lang": "pt"})
        assert (r.status_code, r.json()["error_type"]) == (429, "overloaded")
        assert r.headers["retry-after"] == "1"
        key = {"document_key": first[0]["document_key"]}
        status = c.post(f"/documents/{first[0]['document_id']}", data=key).json()
        assert (status["status"], status["progress"]) == ("queued", 0.0)
        r = c.post(f"/documents/{first[0]['document_id']}/result", data=key)
        assert (r.status_code, r.json()["error_type"]) == (503, "document_not_ready")
        held.set()
        for handle in first:
            assert wait_done(c, handle)[-1]["status"] == "done"
        upload(c, "4.txt", b"Open the file.")  # room again


def test_the_bound_on_documents_comes_before_the_upload_is_parsed(tiny_model_dir: Path,
                                                                  held: threading.Event) -> None:
    """With the documents at their bound, a new upload gets its 429 before it is read: a broken file says so
    (before, it was parsed first and got its 400, and a heavy one cost its parse)."""
    settings = server_settings(tiny_model_dir, max_document_jobs=1, scheduler_process=False)
    with TestClient(create_app(settings)) as c:
        upload(c, "first.txt", b"Open the file.")
        r = c.post("/documents", files={"file": ("broken.docx", b"not a zip")}, data={"target_lang": "pt"})
        assert (r.status_code, r.json()["error_type"]) == (429, "overloaded")
        held.set()


def test_documents_still_translating_are_cancelled_at_stop(tiny_model_dir: Path, held: threading.Event) -> None:
    with TestClient(create_app(server_settings(tiny_model_dir, scheduler_process=False))) as c:
        upload(c, "a.txt", b"Open the file.")
        jobs: documents.DocumentJobs = c.app.state.documents  # type: ignore[attr-defined]
        tasks = [job.task for job in jobs._jobs.values()]
    assert tasks and all(t is not None and t.cancelled() for t in tasks)


def test_documents_expire(tiny_model_dir: Path) -> None:
    with TestClient(create_app(server_settings(tiny_model_dir, file_ttl=0.5, scheduler_process=False))) as c:
        handle = upload(c, "a.txt", b"Open the file.")
        assert wait_done(c, handle)[-1]["status"] == "done"
        time.sleep(0.6)
        r = c.post(f"/documents/{handle['document_id']}", data={"document_key": handle["document_key"]})
        assert (r.status_code, r.json()["error_type"]) == (404, "not_found")


def test_an_api_key_owns_its_documents(tiny_model_dir: Path) -> None:
    settings = server_settings(tiny_model_dir, api_keys=["alpha", "beta"], scheduler_process=False)
    with TestClient(create_app(settings)) as c:
        r = c.post("/documents", files={"file": ("a.txt", b"Open the file.")}, data={"target_lang": "pt"})
        assert r.status_code == 401
        handle = upload(c, "a.txt", b"Open the file.", api_key="alpha")
        key = {"document_key": handle["document_key"]}
        url = f"/documents/{handle['document_id']}"
        assert c.post(url, data=key).status_code == 401
        assert c.post(url, data={**key, "api_key": "beta"}).status_code == 404
        assert c.post(url, data=key, headers={"Authorization": "Bearer alpha"}).status_code == 200


# --- tolk translate-file ------------------------------------------------------------------------------------

def test_the_command_line_translates_as_translate_file(client: TestClient, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "film.srt"
    source.write_text(SRT)
    with live_server(client.app, lifespan=False) as url:  # type: ignore[arg-type]
        out = tmp_path / "out.srt"
        code = cli.main(["translate-file", str(source), "-o", str(out), "--source", "en", "--target", "pt",
                         "--server", url, "--poll", "0.05"])
        assert code == 0, capsys.readouterr().err
        assert out.read_bytes() == via_translate_file(client, "film.srt", SRT.encode())
        assert cli.main(["translate-file", str(source), "--target", "pt", "--server", url, "--quiet"]) == 0
        assert (tmp_path / "film_pt.srt").read_bytes() == out.read_bytes()  # LibreTranslate's name by default
        code = cli.main(["translate-file", str(source), "--source", "en", "--target", "xx", "--server", url])
        assert code == 1
        assert "the server answered 400" in capsys.readouterr().err


def test_the_command_line_says_when_the_server_is_down(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "a.txt"
    source.write_text("Open the file.")
    code = cli.main(["translate-file", str(source), "--target", "pt", "--server", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and "cannot reach the server at http://127.0.0.1:9" in err
    assert not (tmp_path / "a_pt.txt").exists()
