"""API keys, the admin key for POST /settings, settings from the environment, and the `tolk` command line."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from model import checkpoint
from model.checkpoint import LoadedModel
from server.app import create_app
from server.cli import build_parser, main
from server.registry import NoModels, model_dirs, serving_dtype
from server.settings import Settings
from tests.helpers import offline, server_settings


@pytest.fixture(scope="module")
def client(tiny_model_dir: Path) -> Iterator[TestClient]:
    settings = server_settings(tiny_model_dir, api_keys=["alpha", "beta"], admin_key="root",
                             cors_origins=["https://example.org"])
    with TestClient(create_app(settings)) as c:
        yield c


def test_api_keys(client: TestClient) -> None:
    body = {"q": "Open the file.", "target": "pt"}
    r = client.post("/translate", json=body)
    assert (r.status_code, r.json()["error_type"]) == (401, "unauthorized")
    r = client.post("/translate", json={**body, "api_key": "gamma"})
    assert (r.status_code, r.json()["error_type"]) == (403, "forbidden")
    assert client.post("/translate", json={**body, "api_key": "beta"}).status_code == 200
    assert client.post("/translate", json=body, headers={"Authorization": "Bearer alpha"}).status_code == 200
    assert client.post("/translate", data={**body, "api_key": "alpha"}).status_code == 200
    assert client.get("/translate/stream", params={**body, "api_key": "alpha"}).status_code == 200
    assert client.get("/translate/stream", params=body).status_code == 401
    assert client.get("/settings").json()["limits"]["api_key_required"] is True


def test_admin_changes_defaults(client: TestClient, tiny_loaded: LoadedModel) -> None:
    auth = {"Authorization": "Bearer alpha"}
    update = {"defaults": {"max_new_tokens": 3}}
    r = client.post("/settings", json=update)
    assert (r.status_code, r.json()["error_type"]) == (401, "unauthorized")
    r = client.post("/settings", json=update, headers=auth)  # an API key is not the admin key
    assert (r.status_code, r.json()["error_type"]) == (403, "forbidden")
    admin = {"Authorization": "Bearer root"}
    r = client.post("/settings", json={"defaults": {"top_p": 2.0}}, headers=admin)
    assert (r.status_code, r.json()["error_type"]) == (422, "invalid_settings")
    r = client.post("/settings", json={"defaults": {"max_new_tokens": 5000}}, headers=admin)
    assert r.status_code == 422
    r = client.post("/settings", json={"model": "nope", "defaults": {}}, headers=admin)
    assert (r.status_code, r.json()["error_type"]) == (404, "not_found")
    r = client.post("/settings", json=update, headers=admin)
    assert r.status_code == 200 and r.json()["defaults"]["tiny-en-pt"]["max_new_tokens"] == 3
    out = client.post("/translate", json={"q": "Open the file.", "target": "pt", "options": {"return_scores": True}},
                      headers=auth).json()
    assert out["details"]["generated_tokens"] <= 3
    assert out["translatedText"] == offline(tiny_loaded, "Open the file.", max_new_tokens=3)
    client.post("/settings", json={"defaults": {"max_new_tokens": 24}}, headers=admin)


def test_settings_changes_are_refused_without_an_admin_key(served: TestClient) -> None:
    r = served.post("/settings", json={"defaults": {"beam_size": 2}}, headers={"Authorization": "Bearer x"})
    assert (r.status_code, r.json()["error_type"]) == (403, "forbidden")


def test_cors_only_for_configured_origins(client: TestClient) -> None:
    headers = {"Origin": "https://example.org", "Access-Control-Request-Method": "POST"}
    r = client.options("/translate", headers=headers)
    assert r.headers["access-control-allow-origin"] == "https://example.org"
    r = client.options("/translate", headers={**headers, "Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TOLK_MODELS", "a, b")
    monkeypatch.setenv("TOLK_API_KEYS", "k1,k2")
    monkeypatch.setenv("TOLK_MAX_BATCH_ROWS", "48")
    monkeypatch.setenv("TOLK_BATCHING", "false")
    s = Settings(_env_file=None)  # type: ignore[call-arg]
    assert s.models == [Path("a"), Path("b")] and s.max_batch_rows == 48 and s.batching is False
    assert [k.get_secret_value() for k in s.api_keys] == ["k1", "k2"]
    assert "k1" not in repr(s)
    env = tmp_path / ".env"
    env.write_text("TOLK_DEVICE=cpu\nTOLK_REQUEST_TIMEOUT=5\n")
    s = Settings(_env_file=env)  # type: ignore[call-arg]
    assert (s.device, s.request_timeout) == ("cpu", 5.0)


def test_model_discovery(tmp_path: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(NoModels, match="no model to serve"):
        model_dirs(Settings(_env_file=None, weights_dir=tmp_path))  # type: ignore[call-arg]
    with pytest.raises(NoModels, match="not a model directory"):
        model_dirs(Settings(_env_file=None, models=[tmp_path]))  # type: ignore[call-arg]
    assert model_dirs(Settings(_env_file=None, weights_dir=tiny_model_dir.parent)) == [tiny_model_dir]  # type: ignore[call-arg]


def test_cli_serve_without_models_fails_clearly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TOLK_MODELS", raising=False)
    assert main(["serve"]) == 2
    assert "no model to serve" in capsys.readouterr().err


def test_cli_parser_knows_every_command() -> None:
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert isinstance(commands, dict)
    assert {"serve", "translate", "data", "train", "eval", "import-marian", "export-marian"} <= set(commands)
    args = parser.parse_args(["serve", "--port", "9000", "--model", "a", "--model", "b"])
    assert (args.port, args.model) == (9000, [Path("a"), Path("b")])
    # `tolk train --run DIR` is the model card's command: its --run must not shadow the command's handler
    args = parser.parse_args(["train", "--corpus", "c", "--run", "r"])
    assert callable(args.handler) and args.run == Path("r")


def test_cli_translate(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tiny_model_dir: Path,
                       tiny_loaded: LoadedModel) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("Open the file. Disk full.\n\nSave all.\n"))
    assert main(["translate", "--model", str(tiny_model_dir), "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.split("\n")
    first = f"{offline(tiny_loaded, 'Open the file.')} {offline(tiny_loaded, 'Disk full.')}"
    assert lines[:3] == [first, "", offline(tiny_loaded, "Save all.")]


def test_auto_precision_is_int8_on_the_cpu(tiny_model_dir: Path) -> None:
    assert serving_dtype(Settings(_env_file=None, device="cpu")) == "int8"  # type: ignore[call-arg]
    assert serving_dtype(Settings(_env_file=None, device="cpu", dtype="float32")) == "float32"  # type: ignore[call-arg]
    settings = Settings(_env_file=None, models=[tiny_model_dir], device="cpu")  # type: ignore[call-arg]
    with TestClient(create_app(settings)) as c:
        (described,) = c.get("/models").json()
        assert described["dtype"] == "int8" and described["int8"] == "rows"  # no int8.json: a scale per row
        assert described["parameters"] == checkpoint.load(tiny_model_dir, device="cpu").model.num_parameters()
        assert c.post("/translate", json={"q": "Open the file.", "target": "pt"}).json()["translatedText"].strip()
    settings = Settings(_env_file=None, models=[tiny_model_dir], device="cpu", int8="dynamic")  # type: ignore[call-arg]
    with TestClient(create_app(settings)) as c:
        assert c.get("/models").json()[0]["int8"] == "dynamic"
        assert c.post("/translate", json={"q": "Open the file.", "target": "pt"}).json()["translatedText"].strip()
