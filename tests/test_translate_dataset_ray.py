"""`tolk translate-dataset --ray` on a local Ray cluster of two CPUs, started here: each format's output is
`tolk translate`'s line by line (as the one-process job's is), a job whose driver is SIGKILLed mid-way and run again
gives the uninterrupted output, and `Translate` works in a Ray Data pipeline of one's own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="needs Ray Data (pip install 'tolk[ray]')")

from server.datasets import Translate  # noqa: E402
from tests.helpers import (  # noqa: E402
    EXT,
    FORMATS,
    ROWS,
    TOLK,
    assert_translated,
    make_rows,
    read_output,
    reference,
    run_killed,
    translate_dataset,
    write_input,
)

pytestmark = pytest.mark.slow  # a Ray cluster started here

# Holds a Ray head of two CPUs for the module; SIGTERM shuts it down (and a SIGKILL takes Ray's processes with it:
# they share the fate of the process that started them)
HEAD = """
import signal, sys, time, ray
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
ray.init(num_cpus=2, include_dashboard=False, _temp_dir=sys.argv[1])
print(ray.get_runtime_context().gcs_address, flush=True)
while True:
    time.sleep(1)
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    temp = tempfile.mkdtemp(prefix="tolk-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    # no token to hand around, and no usage report sent anywhere
    quiet = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env = {**os.environ, **quiet, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    head = subprocess.Popen([sys.executable, "-c", HEAD, temp], stdout=subprocess.PIPE, text=True, env=env)
    assert head.stdout is not None
    address = head.stdout.readline().strip()
    assert address, "the Ray head did not start"
    os.environ.update(quiet)  # for the drivers this process starts, and those it runs
    try:
        yield address
    finally:
        ray.shutdown()
        head.terminate()
        head.wait(60)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("datasets-ray")
    rows = make_rows()
    return {fmt: write_input(rows, fmt, folder / f"in.{EXT[fmt]}") for fmt in FORMATS}


def test_each_format_on_ray_gives_tolk_translate_line_by_line(cluster: str, inputs: dict[str, Path],
                                                              tiny_model_dir: Path, tmp_path: Path) -> None:
    # 2 actors of 1 thread, and 1 of 2, which holds both CPUs: the reads must not wait for one
    for fmt, actors, threads in (("parquet", 2, 1), ("jsonl", 2, 1), ("csv", 1, 2)):
        output, report = tmp_path / f"out.{EXT[fmt]}", tmp_path / f"{fmt}.json"
        assert translate_dataset(inputs[fmt], output, tiny_model_dir, "--block-rows", "300", "--ray", cluster,
                                 "--actors", str(actors), "--report", str(report), "--threads", str(threads)) == 0
        assert_translated(fmt, make_rows(), read_output(fmt, output), reference(tiny_model_dir))
        assert json.loads(report.read_text())["actors"] == actors


def test_a_ray_job_killed_midway_resumes_to_the_uninterrupted_output(cluster: str, inputs: dict[str, Path],
                                                                     tiny_model_dir: Path, tmp_path: Path) -> None:
    resumed = tmp_path / "resumed.parquet"
    args = ["--block-rows", "100", "--ray", cluster, "--actors", "2"]
    parts = tmp_path / "resumed.parquet.tolk-parts"
    run_killed([*TOLK, "translate-dataset", str(inputs["parquet"]), str(resumed), "--column", "text", "--source",
                "en", "--target", "pt", "--model", str(tiny_model_dir), "--dtype", "float32", "--threads", "1",
                "--quiet", *args], parts, at_least=2)
    done = len(list(parts.glob("part-*")))
    assert not resumed.exists() and done < ROWS // 100
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) < 2:  # the killed driver's actors go with it
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.5)
    assert translate_dataset(inputs["parquet"], resumed, tiny_model_dir, *args) == 0
    # what an uninterrupted job gives, on Ray or here (the tests above)
    assert_translated("parquet", make_rows(), read_output("parquet", resumed), reference(tiny_model_dir))


def test_translate_in_a_ray_data_pipeline_of_ones_own(cluster: str, inputs: dict[str, Path], tiny_model_dir: Path,
                                                      tmp_path: Path) -> None:
    local = tmp_path / "local.parquet"
    assert translate_dataset(inputs["parquet"], local, tiny_model_dir) == 0
    expected = {row["id"]: (row["text_pt"], row["text_pt_error"]) for row in read_output("parquet", local)}
    dataset = ray.data.read_parquet(str(inputs["parquet"])).map_batches(
        Translate, fn_constructor_kwargs={"model": str(tiny_model_dir), "column": "text", "source": "en",
                                          "target": "pt", "threads": 1},
        compute=ray.data.ActorPoolStrategy(size=1), num_cpus=1, batch_size=256)  # numpy batches, Ray's default
    got = {row["id"]: (row["text_pt"], row["text_pt_error"]) for row in dataset.take_all()}
    assert got == expected

