"""Security: per-client rate limits, no internals in error bodies, no user text in logs, pickle-free loading."""

from __future__ import annotations

import io
import logging
import pickle
import shutil
import time
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from model import checkpoint, marian
from server.app import create_app
from server.registry import ServedModel
from server.settings import Settings
from tests.test_server_api import server_settings

BODY = {"q": "Open the file.", "source": "en", "target": "pt"}


@pytest.fixture(scope="module")
def keyed(tiny_model_dir: Path) -> Iterator[TestClient]:
    """API keys on, two requests per minute per key."""
    settings = server_settings(tiny_model_dir, api_keys=["alpha", "beta"], rate_limit="2/minute")
    with TestClient(create_app(settings)) as c:
        yield c


def test_rate_limit_per_key(keyed: TestClient) -> None:
    alpha = {"Authorization": "Bearer alpha"}
    assert [keyed.post("/translate", json=BODY, headers=alpha).status_code for _ in range(2)] == [200, 200]
    r = keyed.post("/translate", json=BODY, headers=alpha)
    assert r.status_code == 429
    assert r.json()["error_type"] == "rate_limited"
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    # the same key through LibreTranslate's field and the stream route counts against the same allowance
    assert keyed.post("/translate", json={**BODY, "api_key": "alpha"}).status_code == 429
    assert keyed.get("/translate/stream", params={**BODY, "api_key": "alpha"}).status_code == 429
    # another key has its own allowance; refused requests are not counted against it
    assert keyed.post("/translate", json={**BODY, "api_key": "beta"}).status_code == 200
    # a wrong key is refused before it is counted, and does not consume anyone's allowance
    assert keyed.post("/translate", json={**BODY, "api_key": "gamma"}).status_code == 403
    assert keyed.post("/translate", json={**BODY, "api_key": "beta"}).status_code == 200
    assert keyed.post("/translate", json={**BODY, "api_key": "beta"}).status_code == 429
    # other routes are not limited
    assert keyed.get("/languages").status_code == 200
    assert keyed.get("/settings").json()["limits"]["rate_limit"] == "2/minute"


def test_rate_limit_by_address_without_keys(tiny_model_dir: Path) -> None:
    """Without keys on, a made-up key must not buy a fresh allowance: the client's address counts."""
    with TestClient(create_app(server_settings(tiny_model_dir, rate_limit="1/minute"))) as c:
        assert c.post("/translate", json=BODY).status_code == 200
        assert c.post("/translate", json={**BODY, "api_key": "made-up"}).status_code == 429
        assert c.post("/translate", json=BODY, headers={"Authorization": "Bearer other"}).status_code == 429


def test_malformed_rate_limit_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="rate_limit"):
        Settings(_env_file=None, rate_limit="lots")  # type: ignore[call-arg]


def test_error_bodies_carry_no_internals(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected exception becomes a 500 with a plain message: no traceback, no path, no exception text."""
    secret = f"boom at {tiny_model_dir}/model.safetensors"

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError(secret)

    monkeypatch.setattr(ServedModel, "translate", broken)
    with TestClient(create_app(server_settings(tiny_model_dir)), raise_server_exceptions=False) as c:
        for r in (c.post("/translate", json=BODY), c.post("/translate/stream", json=BODY)):
            assert r.status_code == 500
            assert r.json() == {"error": "internal server error", "error_type": "engine_failure"}
        for r in (c.post("/translate", content=b"{nope"), c.get("/models/../../etc/passwd")):
            assert "Traceback" not in r.text and str(tiny_model_dir) not in r.text and "/work" not in r.text
    assert secret not in r.text


def test_no_user_text_in_logs_at_info(tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Translations, failures and refusals log at info level without the text they carried."""
    marker = "Zanzibarquux confidential payroll"
    caplog.set_level(logging.INFO)
    with TestClient(create_app(server_settings(tiny_model_dir))) as c:
        assert c.post("/translate", json={**BODY, "q": marker}).status_code == 200
        assert c.post("/translate/stream", json={**BODY, "q": marker}).status_code == 200
        assert c.post("/translate", json={**BODY, "q": marker * 100}).status_code == 413
        assert c.post("/translate", json={**BODY, "q": marker, "options": {"beam_size": 0}}).status_code == 422
        assert c.post("/translate", json={**BODY, "q": marker, "target": "xx"}).status_code == 400
    logged = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.INFO)
    assert logged  # the server did log (start, requests): the check below looks at real output
    assert "Zanzibarquux" not in logged


class _Payload:
    """A pickle that runs code when loaded: it would create the file named by `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def test_model_directories_are_never_unpickled(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Weights load through safetensors only: a pickle in their place is refused and never executed."""
    marker = tmp_path / "pwned"
    bad = tmp_path / "model"
    shutil.copytree(tiny_model_dir, bad)
    with (bad / "model.safetensors").open("wb") as f:
        pickle.dump({"weights": _Payload(marker)}, f)
    with pytest.raises(Exception):  # noqa: B017 - whatever safetensors raises, the payload must not run
        checkpoint.load(bad, device="cpu")
    assert not marker.exists()
    # a Hugging Face directory with only a pickled .bin goes through torch's weights-only unpickler
    hf = tmp_path / "hf"
    hf.mkdir()
    torch.save({"weights": _Payload(marker)}, hf / "pytorch_model.bin")
    with pytest.raises(pickle.UnpicklingError):
        marian.load_weights(hf)
    assert not marker.exists()


# --- hostile files (POST /translate_file) -------------------------------------------------------------------

W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
PARAGRAPH = f'<w:document {W}><w:body><w:p><w:r><w:t>Open the file.</w:t></w:r></w:p></w:body></w:document>'
LAUGHS = ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
          + "".join(f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10 if i > 1 else "&lol;" * 10}">' for i in range(1, 10))
          + f']><w:document {W}><w:body><w:p><w:r><w:t>&lol9;</w:t></w:r></w:p></w:body></w:document>')


def zipped(entries: dict[str, bytes | str]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return out.getvalue()


def word(document: str, **more: bytes | str) -> bytes:
    """A minimal .docx: its content types and its document part (and more entries)."""
    return zipped({"[Content_Types].xml": "<Types/>", "word/document.xml": document, **more})


def patched(data: bytes, local: int, central: int, value: bytes) -> bytes:
    """The archive with `value` written at one offset of every local header and one of every central record."""
    out = bytearray(data)
    for signature, offset in ((b"PK\x03\x04", local), (b"PK\x01\x02", central)):
        at = out.find(signature)
        while at >= 0:
            out[at + offset:at + offset + len(value)] = value
            at = out.find(signature, at + 4)
    return bytes(out)


def understated(data: bytes, size: int) -> bytes:
    """The archive with every entry's declared size set to `size`."""
    return patched(data, 22, 24, size.to_bytes(4, "little"))


def encrypted(data: bytes) -> bytes:
    """The archive with every entry marked as encrypted (bit 0 of its flags)."""
    return patched(data, 6, 8, b"\x01\x00")


def duplicated(data: bytes) -> bytes:
    """The archive with a second word/document.xml (a reader could take either)."""
    out = io.BytesIO(data)
    with warnings.catch_warnings(), zipfile.ZipFile(out, "a") as z:
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name: that is the point
        z.writestr("word/document.xml", PARAGRAPH.replace("Open", "Close"))
    return out.getvalue()


def damaged(data: bytes) -> bytes:
    """The archive with the start of its document part's compressed bytes overwritten (its directory intact)."""
    at = data.find(b"word/document.xml") + len("word/document.xml")
    return data[:at] + b"\xff" * 20 + data[at + 20:]


def hostile_files(secret: Path) -> dict[str, tuple[str, bytes, int, str]]:
    """case -> (file name, bytes, expected status, expected error_type), for a server with small file limits."""
    xxe = (f'<?xml version="1.0"?><!DOCTYPE w:document [<!ENTITY s SYSTEM "file://{secret}">]><w:document {W}>'
           '<w:body><w:p><w:r><w:t>&s;</w:t></w:r></w:p></w:body></w:document>')
    nested = f'<w:document {W}><w:body>{"<w:sdt>" * 5000}{"</w:sdt>" * 5000}</w:body></w:document>'
    bomb = word(PARAGRAPH, **{"word/media/zeros.bin": b"\0" * (2 << 20)})
    epub = zipped({"mimetype": "application/epub+zip", "META-INF/container.xml": "<container/>"})
    odt = zipped({"mimetype": "application/vnd.oasis.opendocument.text", "content.xml": LAUGHS})
    return {
        "zip bomb": ("bomb.docx", bomb, 413, "payload_too_large"),
        "sizes that lie": ("lying.docx", understated(bomb, 100), 400, "invalid_document"),
        "too many entries": ("many.docx", word(PARAGRAPH, **{f"e{i}": "" for i in range(60)}), 413,
                             "payload_too_large"),
        "external entity": ("xxe.docx", word(xxe), 400, "invalid_document"),
        "billion laughs": ("laughs.docx", word(LAUGHS), 400, "invalid_document"),
        "billion laughs in odt": ("laughs.odt", odt, 400, "invalid_document"),
        "deep nesting": ("deep.docx", word(nested), 400, "invalid_document"),
        "entry leaves its folder": ("escape.docx", word(PARAGRAPH, **{"../../evil.sh": "x"}), 400,
                                    "invalid_document"),
        "absolute entry": ("absolute.docx", word(PARAGRAPH, **{"/etc/evil": "x"}), 400, "invalid_document"),
        "drive letter entry": ("drive.docx", word(PARAGRAPH, **{"C:/evil": "x"}), 400, "invalid_document"),
        "backslash entry": ("backslash.docx", word(PARAGRAPH, **{"..\\evil": "x"}), 400, "invalid_document"),
        "duplicate entry": ("twice.docx", duplicated(word(PARAGRAPH)), 400, "invalid_document"),
        "encrypted entries": ("locked.docx", encrypted(word(PARAGRAPH)), 400, "invalid_document"),
        "not a zip": ("text.docx", b"Open the file.", 400, "invalid_document"),
        "another zip": ("book.docx", epub, 400, "invalid_document"),
        "not xml": ("broken.docx", word("<w:document><w:body>"), 400, "invalid_document"),
        "truncated": ("cut.docx", word(PARAGRAPH)[:-30], 400, "invalid_document"),
        "damaged entry": ("damaged.docx", damaged(word(PARAGRAPH * 50)), 400, "invalid_document"),
        "binary text": ("program.txt", b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0", 400, "invalid_document"),
        "not utf-8": ("latin.txt", "café crème".encode("latin-1"), 400, "invalid_encoding"),
        "oversized upload": ("big.txt", b"Open the file. " * 5000, 413, "payload_too_large"),
        "too much text": ("long.txt", b"Open the file. " * 100, 413, "payload_too_large"),
    }


@pytest.fixture(scope="module")
def filed(tiny_model_dir: Path) -> Iterator[TestClient]:
    """Small file limits: 64 KiB uploads, 1000 characters, 1 MiB expanded, 50 entries."""
    settings = server_settings(tiny_model_dir, max_file_bytes=64 * 1024, max_file_chars=1000,
                               max_file_expanded_bytes=1 << 20, max_file_entries=50, scheduler_process=False)
    with TestClient(create_app(settings)) as c:
        yield c


CASES = list(hostile_files(Path("/nonexistent")))


@pytest.mark.parametrize("case", CASES)
def test_hostile_files_get_a_clear_4xx(filed: TestClient, tmp_path: Path, case: str) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("Zanzibarquux private key")
    name, data, status, error_type = hostile_files(secret)[case]
    started = time.monotonic()
    r = filed.post("/translate_file", files={"file": (name, data)}, data={"source": "en", "target": "pt"})
    assert (r.status_code, r.json()["error_type"]) == (status, error_type), r.text
    assert "Zanzibarquux" not in r.text and "Traceback" not in r.text
    assert time.monotonic() - started < 5


def test_still_translating_files_after_hostile_ones(filed: TestClient) -> None:
    r = filed.post("/translate_file", files={"file": ("ok.docx", word(PARAGRAPH))}, data={"target": "pt"})
    assert r.status_code == 200, r.text
    assert filed.get(r.json()["translatedFileUrl"]).status_code == 200
    assert filed.post("/translate", json=BODY).status_code == 200
