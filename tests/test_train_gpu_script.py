"""bench/gpu/train.py end to end on the CPU: pack-corpus -> start --dry-run -> status -> collect -> join."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from model import checkpoint
from tests.helpers import trained_copy, write_corpus

pytestmark = pytest.mark.slow  # bench/gpu/train.py's training end to end

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu" / "train.py"


def script(*argv: str | Path, timeout: float = 300) -> str:  # a guard against a hang, not a time limit
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(SCRIPT), *map(str, argv)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_dry_run_start_status_collect_join(tmp_path: Path) -> None:
    corpus, work, out = write_corpus(tmp_path / "corpus"), tmp_path / "work", tmp_path / "out"
    archive = tmp_path / "corpus.tar.xz"
    script("pack-corpus", "--corpus", corpus, "--out", archive, "--preset", "1")
    script("start", "--corpus", archive, "--work", work, "--minutes", "0.5", "--device", "cpu", "--dry-run")
    assert all(name in script("status", "--work", work) for name in ("en-pt-small", "en-pt-medium", "pt-en-small"))
    script("collect", "--work", work, "--out", out, "--runs", "en-pt-small", "en-pt-medium", "pt-en-small",
           "--weights", "en-pt-small", "pt-en-small", "--device", "cpu", "--limit", "8", "--timeout", "240")
    assert "done" in script("status", "--work", work)
    assert len(list(out.iterdir())) <= 8
    report = json.loads((out / "scores.json").read_text())
    for name, run in report["runs"].items():
        assert run["state"] == "done" and run["step"] > 0 and run["tokens_per_s"] > 0, name
        assert run["test"]["sentences"] == 8 and run["test"]["direction"] == name[:5]
        assert run["dev"], name  # the dev evaluation ran during training
    assert report["shipped"]["test"]["direction"] == "en-pt"
    script("join", "--pieces", out, "--out", tmp_path / "models")
    for name, (source, target) in (("en-pt-small", ("en", "pt")), ("pt-en-small", ("pt", "en"))):
        loaded = checkpoint.load(tmp_path / "models" / name, device="cpu")
        assert (loaded.info.source_language, loaded.info.target_language) == (source, target)
        shared = (REPO / "weights" / "en-pt" / "target.spm").read_bytes()  # the shipped models' shared vocabulary
        for spm in ("source.spm", "target.spm"):
            assert (tmp_path / "models" / name / spm).read_bytes() == shared
    assert not (tmp_path / "models" / "en-pt-medium").exists()  # scores only


def test_a_run_continues_a_model_whose_source_has_a_vocabulary_of_its_own(tmp_path: Path) -> None:
    """`start --init` with a model made by `tolk extend-source-vocab` (as the shipped pt-en is): the run trains on
    that model's two vocabularies, and the model it brings back has them."""

    corpus, ext = trained_copy(tmp_path)
    work, out = tmp_path / "work", tmp_path / "out"
    script("start", "--corpus", corpus, "--work", work, "--minutes", "0.3", "--device", "cpu", "--dry-run",
           "--runs", "pt-en-small", "--init", f"pt-en-small={ext}")
    script("collect", "--work", work, "--out", out, "--runs", "pt-en-small", "--weights", "pt-en-small",
           "--device", "cpu", "--limit", "8", "--timeout", "240", "--shipped", "none")
    run = json.loads((out / "scores.json").read_text())["runs"]["pt-en-small"]
    assert run["state"] == "done" and run["step"] > 0, run
    script("join", "--pieces", out, "--out", tmp_path / "models")
    model = tmp_path / "models" / "pt-en-small"
    for spm in ("source.spm", "target.spm"):
        assert (model / spm).read_bytes() == (ext / spm).read_bytes(), spm
    assert (ext / "source.spm").read_bytes() != (ext / "target.spm").read_bytes()
    loaded = checkpoint.load(model, device="cpu")
    assert loaded.model.cfg.src_vocab_size > loaded.model.cfg.tgt_vocab_size  # the source's own pieces kept


def test_pack_corpus_adds_extra_train_pairs_and_keeps_the_held_out_splits(tmp_path: Path) -> None:
    import tarfile

    corpus = write_corpus(tmp_path / "corpus")
    extra = tmp_path / "distill"
    extra.mkdir()
    (extra / "train.en").write_text("the cow is fresh\nrevise a thesis\n", encoding="utf-8")
    (extra / "train.pt").write_text("a vaca está fresca\nrevisar uma tese\n", encoding="utf-8")
    archive = tmp_path / "corpus.tar.xz"
    script("pack-corpus", "--corpus", corpus, "--out", archive, "--preset", "1", "--extra", f"{extra}:2")
    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read().decode().splitlines() for m in tar.getmembers()}  # type: ignore[union-attr]
    train = list(zip(files["train.en"], files["train.pt"], strict=True))
    en, pt = ((corpus / f"train.{lang}").read_text().splitlines() for lang in ("en", "pt"))
    before = list(zip(en, pt, strict=True))
    assert sorted(train) == sorted(before + [("the cow is fresh", "a vaca está fresca"),
                                             ("revise a thesis", "revisar uma tese")] * 2)
    for split in ("dev", "test"):
        for lang in ("en", "pt"):
            assert files[f"{split}.{lang}"] == (corpus / f"{split}.{lang}").read_text().splitlines()
