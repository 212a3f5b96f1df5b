"""The compose files and the Kubernetes manifests checked against their published schemas by real validators, with
no network: check-jsonschema's bundled Compose specification and kubernetes-validate's bundled Kubernetes schemas
(strict: unknown fields are errors). Custom resources (ServiceMonitor, KEDA's ScaledObject) have no bundled schema;
tests/test_deploy.py and tests/test_prometheus.py check what they refer to."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "kubernetes"
CUSTOM = {"ServiceMonitor", "ScaledObject", "Kustomization"}


def manifests() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and "kind" in doc and doc["kind"] not in CUSTOM:
                found.append((str(path.relative_to(ROOT)), doc))
    return found


def test_compose_files_follow_the_compose_specification() -> None:
    files = [ROOT / "docker-compose.yml", ROOT / "docker-compose.gpu.yml"]
    done = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                           *map(str, files)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_compose_file_that_breaks_the_specification_is_caught(tmp_path: Path) -> None:
    broken = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    next(iter(broken["services"].values()))["restart_policy"] = "always"  # not a service key (restart is)
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    done = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                           str(path)], capture_output=True, text=True)
    assert done.returncode == 1 and "restart_policy" in done.stdout + done.stderr


@pytest.mark.parametrize(("name", "doc"), manifests(), ids=lambda x: x if isinstance(x, str) else x["kind"])
def test_kubernetes_manifests_follow_the_kubernetes_schemas(name: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_the_manifests_are_found_and_a_broken_one_is_caught() -> None:
    kinds = {doc["kind"] for _, doc in manifests()}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ConfigMap"} <= kinds
    deployment = copy.deepcopy(next(doc for _, doc in manifests() if doc["kind"] == "Deployment"))
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)
