"""bench/gpu/train.py end to end on the CPU: pack-corpus -> start --dry-run -> status -> collect -> join."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from model import checkpoint
from tests.test_train import write_corpus

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu" / "train.py"


def script(*argv: str | Path, timeout: float = 120) -> str:
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
           "--weights", "en-pt-small", "pt-en-small", "--device", "cpu", "--limit", "8", "--timeout", "100")
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
        shipped_spm = (REPO / "weights" / "en-pt" / "source.spm").read_bytes()
        assert (tmp_path / "models" / name / "source.spm").read_bytes() == shipped_spm  # the shipped vocabulary
    assert not (tmp_path / "models" / "en-pt-medium").exists()  # scores only


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
