"""`tolk pull`: a Hub repository downloaded through huggingface_hub and imported in one step, against a small HTTP
server in the test that answers as the Hub's file API does (HF_ENDPOINT points at it), with no network."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from model import checkpoint, marian
from model.pull import pull
from server.cli import main as tolk
from tests.helpers import build_hf_dir

REPO = "Helsinki-NLP/opus-mt-en-pt"
SHA = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """Serves repositories {repo_id: directory} as the Hub's API does: model info, and files by revision."""

    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos = repos
        self.downloads: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
                self.answer(body=False)

            def do_GET(self) -> None:  # noqa: N802
                self.answer(body=True)

            def answer(self, body: bool) -> None:
                path = self.path.split("?")[0]
                for repo, directory in hub.repos.items():
                    if path.startswith(f"/api/models/{repo}/tree/"):  # the file list of a revision
                        tree = [{"type": "file", "path": f.name, "size": f.stat().st_size,
                                 "oid": hashlib.sha1(f.read_bytes()).hexdigest()}
                                for f in sorted(directory.iterdir()) if f.is_file()]
                        return self.send(json.dumps(tree).encode(), "application/json", body)
                    if path.startswith(f"/api/models/{repo}"):
                        files = sorted(p.name for p in directory.iterdir() if p.is_file())
                        info = {"id": repo, "modelId": repo, "sha": SHA, "private": False,
                                "siblings": [{"rfilename": f} for f in files]}
                        return self.send(json.dumps(info).encode(), "application/json", body)
                    prefix = f"/{repo}/resolve/"
                    if path.startswith(prefix):
                        name = path[len(prefix):].split("/", 1)[1]
                        file = directory / name
                        if not file.is_file():
                            return self.missing()
                        if body:
                            hub.downloads.append(name)
                        return self.send(file.read_bytes(), "application/octet-stream", body)
                self.missing()

            def send(self, data: bytes, kind: str, body: bool) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("X-Repo-Commit", SHA)
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def missing(self) -> None:
                self.send_response(404)
                self.send_header("X-Error-Code", "RepoNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def hub_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_hf_dir(tmp_path_factory.mktemp("hub") / "opus-mt-en-pt", steps=0)


@pytest.fixture
def hub(hub_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    fake = FakeHub({REPO: hub_dir})
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    import huggingface_hub.constants as constants

    # huggingface_hub read HF_ENDPOINT when it was imported (by transformers, earlier in the session): point the
    # values it derived at the fake too; a fresh `tolk pull` process reads the variable itself
    monkeypatch.setattr(constants, "ENDPOINT", fake.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", fake.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield fake
    fake.server.shutdown()


def test_pull_equals_importing_the_same_files(hub: FakeHub, hub_dir: Path, tmp_path: Path) -> None:
    out = pull(REPO, weights_dir=tmp_path / "weights")
    assert out == tmp_path / "weights" / "opus-mt-en-pt"
    reference = marian.import_marian(hub_dir, tmp_path / "reference")
    for name in ("config.json", "generation.json", "vocab.json", "source.spm", "target.spm"):
        if (reference / name).exists():
            assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    pulled, local = checkpoint.load(out), checkpoint.load(reference)
    assert (pulled.info.source_language, pulled.info.target_language) == ("en", "pt")
    for key, value in local.model.state_dict().items():
        assert pulled.model.state_dict()[key].equal(value), key
    assert "pytorch_model.bin" not in hub.downloads  # safetensors only; and no file the import does not read
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # nothing left beside it


def test_a_second_pull_downloads_nothing(hub: FakeHub, tmp_path: Path) -> None:
    pull(REPO, weights_dir=tmp_path / "a")
    count = len(hub.downloads)
    pull(REPO, weights_dir=tmp_path / "b")  # another destination: the files come from the cache
    assert len(hub.downloads) == count and (tmp_path / "b" / "opus-mt-en-pt" / "config.json").is_file()


def test_the_command_reports_a_missing_repository(hub: FakeHub, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "weights" / "nothing"
    assert tolk(["pull", "Helsinki-NLP/opus-mt-xx-yy", "--to", str(target)]) == 1
    assert "no model repository" in capsys.readouterr().err
    assert not target.exists()
    assert tolk(["pull", REPO, "--to", str(tmp_path / "weights" / "en-pt")]) == 0
    assert (tmp_path / "weights" / "en-pt" / "model.safetensors").is_file()


def test_tolk_import_recognises_a_marian_checkpoint(hub_dir: Path, tmp_path: Path) -> None:
    """`tolk import` (and its alias import-marian) of a Marian directory writes what import_marian writes."""
    reference = marian.import_marian(hub_dir, tmp_path / "reference")
    for command in ("import", "import-marian"):
        out = tmp_path / command
        assert tolk([command, str(hub_dir), str(out)]) == 0
        for name in ("config.json", "generation.json", "vocab.json", "info.json"):
            if (reference / name).exists():
                assert (out / name).read_bytes() == (reference / name).read_bytes(), name
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
