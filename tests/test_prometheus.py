"""The deployment's monitoring, run for real: Debian's Prometheus, started here with the repository's own
configuration (deploy/prometheus/prometheus.yml, its target pointed at a live server), scrapes the server under a
short load; then every PromQL query of the Grafana dashboard and the autoscaler's query is asked of that Prometheus
through its HTTP API, and each must return data. A query that returns nothing is a broken panel.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from server.app import create_app
from tests.helpers import free_port, server_settings
from tests.live import live_server

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "tolk.json"
CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
ADAPTER = ROOT / "deploy" / "kubernetes" / "prometheus-adapter-values.yaml"
KEDA = ROOT / "deploy" / "kubernetes" / "keda" / "scaledobject.yaml"
SCRAPE_S = 1
# What Grafana puts in place of its variables: every instance and model, and a rate window of several scrapes.
GRAFANA_VARIABLES = {"$instance": ".*", "$model": ".*", "$__rate_interval": "20s", "$__range": "5m"}

pytestmark = [pytest.mark.slow,  # a real Prometheus
              pytest.mark.skipif(shutil.which("prometheus") is None,
                                 reason="needs Debian's prometheus package (.ci/run installs it)")]


def panels(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in node.get("panels", []):
        yield panel
        yield from panels(panel)


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every dashboard panel target and variable, Grafana's variables filled in."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = [(f"panel {p.get('title')!r}", t["expr"]) for p in panels(dashboard) for t in p.get("targets", [])
             if t.get("expr")]
    for var in dashboard.get("templating", {}).get("list", []):
        query = var.get("definition", "")
        if query.startswith("label_values("):  # Grafana's label_values(metric, label): the metric's series
            metric, label = (s.strip() for s in query[len("label_values("):-1].split(","))
            found.append((f"variable {var['name']!r}", f"count by ({label}) ({metric})"))
    filled = []
    for where, expr in found:
        for name, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(name, value)
        filled.append((where, expr))
    return filled


def adapter_query() -> str:
    """The prometheus-adapter rule behind the autoscaler, as the adapter expands it for one namespace."""
    rule = yaml.safe_load(ADAPTER.read_text())["rules"]["custom"][0]
    series = rule["seriesQuery"].split("{")[0]
    return rule["metricsQuery"].replace("<<.Series>>", series).replace("<<.LabelMatchers>>", "") \
        .replace("<<.GroupBy>>", "model")


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def post(url: str, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as exc:  # the load includes refused requests
        return bytes(exc.read())


def load(base: str) -> None:
    """Whole and streamed translations, repeats (cache hits) and refusals: every panel has something to show."""
    for i in range(6):
        post(base + "/translate", {"q": [f"Open the file {i}.", "Save changes before closing."], "source": "en",
                                   "target": "pt"})
        post(base + "/translate/stream", {"q": f"The disk {i} is full.", "source": "en", "target": "pt"})
        post(base + "/translate", {"q": "Hello", "source": "en", "target": "xx"})  # 400 unsupported_language


@pytest.fixture(scope="module")
def prometheus(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("prometheus")
    settings = server_settings(tiny_model_dir, translation_cache_entries=100, scheduler_process=True)
    with live_server(create_app(settings)) as base:
        config = yaml.safe_load(CONFIG.read_text())
        config["global"]["scrape_interval"] = f"{SCRAPE_S}s"
        job = next(j for j in config["scrape_configs"] if j["job_name"] == "tolk")
        job.pop("dns_sd_configs")  # the compose stack finds replicas by DNS; here there is one, at a known address
        job["static_configs"] = [{"targets": [base.removeprefix("http://")]}]
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        server = subprocess.Popen(["prometheus", f"--config.file={work / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                  stdout=subprocess.DEVNULL, stderr=(work / "prometheus.log").open("wb"))
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    targets = get(url + "/api/v1/targets")["data"]["activeTargets"]
                    if any(t["labels"]["job"] == "tolk" and t["health"] == "up" for t in targets):
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, (work / "prometheus.log").read_text()[-2000:]
                time.sleep(0.2)
            for _ in range(3):  # load over several scrapes, so that rates have two points in their window
                load(base)
                time.sleep(2 * SCRAPE_S)
            time.sleep(2 * SCRAPE_S)
            yield url
        finally:
            server.terminate()
            server.wait(30)


def query(url: str, expr: str) -> list[Any]:
    answer = get(url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def test_every_dashboard_query_returns_data(prometheus: str) -> None:
    empty = [f"{where}: {expr}" for where, expr in dashboard_queries() if not query(prometheus, expr)]
    assert not empty, "queries that return nothing (broken panels):\n" + "\n".join(empty)


def test_the_autoscaler_query_returns_the_queue_depth(prometheus: str) -> None:
    result = query(prometheus, adapter_query())
    assert result and result[0]["metric"]["model"] == "tiny-en-pt"


def test_the_dashboard_has_queries_to_check() -> None:
    assert len(dashboard_queries()) >= 25  # the walk found the panels (a dashboard reshaped would leave this empty)


def test_the_keda_query_returns_the_queue_depth_and_null_is_an_error(prometheus: str) -> None:
    """KEDA's trigger asks Prometheus for a number; with ignoreNullValues false an empty answer falls back to
    `fallback.replicas` instead of scaling to the minimum, so the query must answer on a healthy server."""
    spec = yaml.safe_load(KEDA.read_text())["spec"]
    [trigger] = spec["triggers"]
    result = query(prometheus, trigger["metadata"]["query"])
    assert len(result) == 1 and float(result[0]["value"][1]) >= 0
    assert trigger["metadata"]["ignoreNullValues"] == "false"
    assert spec["minReplicaCount"] >= 1 and spec["fallback"]["replicas"] >= spec["minReplicaCount"]
    kustomization = yaml.safe_load((KEDA.parent / "kustomization.yaml").read_text())
    assert "../hpa.yaml" not in kustomization["resources"]  # one autoscaler per Deployment
    assert all((KEDA.parent / r).is_file() for r in kustomization["resources"])
