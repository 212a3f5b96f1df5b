"""Three trainings at once on one lent GPU, their scores and weights brought back through a small folder.

The GPU machine has no network and returns at most 8 files of 16 MB per command, so the corpus goes there as one
.tar.xz and each exported model comes back as a tar cut into 15 MB pieces (weights in float16). A run from scratch
reuses the shipped models' shared SentencePiece model (weights/en-pt/target.spm); a run that continues a model
(`--init`) takes that model's vocabularies, its source's own where it has one (`tolk extend-source-vocab`).

    python bench/gpu/train.py pack-corpus --corpus data/corpus --out data/corpus.tar.xz     # here
    python bench/gpu/train.py start --corpus data/corpus.tar.xz --work /tmp/tolk-gpu --minutes 12  # GPU machine
    python bench/gpu/train.py status --work /tmp/tolk-gpu
    python bench/gpu/train.py collect --work /tmp/tolk-gpu --out "$OUT" \\
        --runs en-pt-small en-pt-medium pt-en-small --weights en-pt-small pt-en-small  # 5 files, about 38 MB
    python bench/gpu/train.py join --pieces DIR --out runs/gpu                                # here

`start` returns at once: each training is a detached process (its own session) that stops itself after --minutes
and exports the average of its last snapshots. `--dry-run --device cpu` trains the tiny architecture for a few
steps instead, so that the whole path runs on a laptop (tests/test_train_gpu_script.py).
Needs torch, sentencepiece, safetensors, numpy, tqdm, sacrebleu and the repository on PYTHONPATH; nothing of the
server.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LANGUAGES = ("en", "pt")
SPLITS = ("train", "dev", "test")
PIECE_BYTES = 15 * 2**20
MAX_FILES = 8  # what one command on the lent machine may bring back


@dataclass(frozen=True)
class RunSpec:
    name: str
    arch: str
    source: str
    target: str
    lr: float


RUNS = (
    RunSpec("en-pt-small", "small", "en", "pt", 1.5e-3),  # the shipped model's architecture
    RunSpec("en-pt-medium", "medium", "en", "pt", 1e-3),
    RunSpec("pt-en-small", "small", "pt", "en", 1.5e-3),
)
# 16k padded tokens a step (the CPU recipe's 3k times 5.3): a fifth of its steps for the same warm-up tokens, and a
# peak rate half as high again for the larger batch. Snapshots every 200 steps (about a minute), the last 4 averaged.
GPU_TRAINING = dict(max_tokens=16384, warmup=400, save_every=200, keep=8, average=4, eval_every=1000,
                    dev_sentences=400, max_steps=100_000, threads=4)
DRY_TRAINING = dict(max_tokens=1024, warmup=20, save_every=10, keep=4, average=2, eval_every=20,
                    dev_sentences=8, max_steps=30, threads=1)


def corpus_files(corpus: Path) -> list[Path]:
    return [corpus / f"{split}.{lang}" for split in SPLITS for lang in LANGUAGES]


def pack_corpus(args: argparse.Namespace) -> int:
    """The corpus as one .tar.xz (flat names), for a machine without network; with `--extra`, those folders' train
    pairs join the corpus's train split first (model.data.mix)."""
    corpus = args.corpus
    with tempfile.TemporaryDirectory() as tmp:
        if args.extra:
            from model.data.mix import mix, parse_part

            corpus = Path(tmp)
            count = mix([(args.corpus, 1), *(parse_part(x) for x in args.extra)], corpus, seed=5)
            for lang in LANGUAGES:
                shutil.copyfile(args.corpus / f"test.{lang}", corpus / f"test.{lang}")
            print(f"train split with {', '.join(args.extra)}: {count} pairs")
        with tarfile.open(args.out, "w:xz", preset=args.preset) as tar:
            for path in corpus_files(corpus):
                tar.add(path, arcname=path.name)
    print(f"wrote {args.out}: {args.out.stat().st_size / 1e6:.2f} MB")
    return 0


def unpacked_corpus(corpus: Path, work: Path) -> Path:
    """A corpus directory: the given one, or an archive from pack-corpus unpacked into work/corpus."""
    if corpus.is_dir():
        return corpus.resolve()
    target = work / "corpus"
    if not all(p.exists() for p in corpus_files(target)):
        with tarfile.open(corpus) as tar:
            tar.extractall(target, filter="data")
    return target.resolve()


def run_dir(work: Path, name: str) -> Path:
    return work / "runs" / name


def vocabulary_argv(shared: Path, init: Path | None) -> list[str]:
    """`tolk train`'s vocabulary flags: the shared vocabulary, or the one of the model a run continues, with
    `--source-spm` when that model's source has a vocabulary of its own (tolk train refuses it otherwise)."""
    if init is None:
        return ["--spm", str(shared)]
    from model.train import model_vocabularies

    vocab = model_vocabularies(init)
    argv = ["--spm", str(vocab.target)]
    return argv if vocab.shared else [*argv, "--source-spm", str(vocab.source)]


def train_argv(spec: RunSpec, corpus: Path, run: Path, minutes: float, device: str, vocab: list[str],
               dry_run: bool) -> list[str]:
    s = DRY_TRAINING if dry_run else GPU_TRAINING
    lr = 3e-3 if dry_run else spec.lr
    return ["--corpus", str(corpus), "--run", str(run), "--arch", "tiny" if dry_run else spec.arch,
            "--source", spec.source, "--target", spec.target, *vocab, "--device", device,
            "--max-tokens", str(s["max_tokens"]), "--lr", str(lr), "--warmup", str(s["warmup"]),
            "--save-every", str(s["save_every"]), "--average", str(s["keep"]), "--eval-every", str(s["eval_every"]),
            "--dev-sentences", str(s["dev_sentences"]), "--max-steps", str(s["max_steps"]),
            "--max-hours", str(minutes / 60), "--threads", str(s["threads"])]


def start(args: argparse.Namespace) -> int:
    """Launch the chosen runs as detached processes (each its own session) and return."""
    args.work.mkdir(parents=True, exist_ok=True)
    corpus = unpacked_corpus(args.corpus, args.work)
    chosen = [r for r in RUNS if r.name in args.runs]
    inits = dict((name, Path(directory)) for name, _, directory in (i.partition("=") for i in args.init))
    for spec in chosen:
        run = run_dir(args.work, spec.name).resolve()
        run.mkdir(parents=True, exist_ok=True)
        if alive(run):
            print(f"{spec.name}: already running (pid {(run / 'pid').read_text().strip()})")
            continue
        (run / "done.json").unlink(missing_ok=True)
        init = inits[spec.name].resolve() if spec.name in inits else None
        argv = train_argv(spec, corpus, run, args.minutes, args.device, vocabulary_argv(args.spm.resolve(), init),
                          args.dry_run)
        if init is not None:
            argv += ["--init", str(init)]
        plan = {"spec": asdict(spec), "minutes": args.minutes, "dry_run": args.dry_run, "corpus": str(corpus),
                "train": argv,
                "export": ["--run", str(run), "--corpus", str(corpus), "--export", str(run / "export"),
                           "--average", str((DRY_TRAINING if args.dry_run else GPU_TRAINING)["average"]),
                           "--weights-dtype", "float16", "--device", "cpu"]}
        (run / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        with (run / "train.log").open("ab") as log:
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "worker", str(run)], cwd=REPO,
                                    env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        (run / "pid").write_text(f"{proc.pid}\n")
        print(f"{spec.name}: started, pid {proc.pid}, log {run / 'train.log'}")
    return 0


def worker(args: argparse.Namespace) -> int:
    """One run, in its own process: train until the deadline, export, write done.json (or the error)."""
    from model import train

    run: Path = args.run
    plan = json.loads((run / "plan.json").read_text())
    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    t0 = time.time()
    result: dict[str, Any] = {}
    try:
        train.main(parser.parse_args(plan["train"]))
        result["train_seconds"] = round(time.time() - t0, 1)
        train.main(parser.parse_args(plan["export"]))
        result["ok"] = True
    except Exception:
        result |= {"ok": False, "error": traceback.format_exc()}
    result["seconds"] = round(time.time() - t0, 1)
    (run / "done.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["ok"] else 1


def alive(run: Path) -> bool:
    if not (run / "pid").exists() or (run / "done.json").exists():
        return False
    try:
        os.kill(int((run / "pid").read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def progress(run: Path) -> dict[str, Any]:
    """What the run's log.jsonl and done.json say: state, last step, loss, tokens/s, dev scores."""
    done = json.loads((run / "done.json").read_text()) if (run / "done.json").exists() else None
    state = ("done" if done["ok"] else "failed") if done else ("running" if alive(run) else "stopped")
    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()] \
        if (run / "log.jsonl").exists() else []
    steps = [r for r in rows if "loss" in r]
    rates = [r["tokens_per_s"] for r in steps[1:]] or [r["tokens_per_s"] for r in steps]
    last = steps[-1] if steps else {}
    return {"state": state, "step": last.get("step", 0), "loss": last.get("loss"), "epoch": last.get("epoch"),
            "tokens_per_s": round(sum(rates) / len(rates)) if rates else None,
            "dev": [{"step": r["step"], **r["dev"]} for r in rows if "dev" in r],
            "train_minutes": round(done["train_seconds"] / 60, 2) if done and "train_seconds" in done else None,
            "error": done.get("error", "").splitlines()[-1:] if done else [],
            "log_tail": [] if state in ("done", "running") else log_tail(run / "train.log")}


def log_tail(path: Path, lines: int = 5) -> list[str]:
    """The last lines of a log (tqdm's carriage-return updates cut apart): why a run stopped."""
    if not path.exists():
        return []
    text = path.read_bytes()[-8192:].decode("utf-8", "replace")
    return [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()][-lines:]


def status(args: argparse.Namespace) -> int:
    print(f"{'run':14} {'state':8} {'step':>7} {'loss':>7} {'tok/s':>8} {'epoch':>5}  dev BLEU (last)")
    for run in sorted((args.work / "runs").glob("*")):
        p = progress(run)
        dev = p["dev"][-1]["bleu"] if p["dev"] else "-"
        print(f"{run.name:14} {p['state']:8} {p['step']:>7} {p['loss'] or '-':>7} {p['tokens_per_s'] or '-':>8} "
              f"{p['epoch'] if p['epoch'] is not None else '-':>5}  {dev}")
        for line in p["error"] or p["log_tail"]:
            print(f"    {line}")
    return 0


def evaluate(model_dir: Path, corpus: Path, device: str, limit: int) -> dict[str, Any]:
    """Greedy BLEU and chrF on the test split, in the model's own direction (model.evaluate's code)."""
    import torch

    from model import checkpoint
    from model.evaluate import score, translate_lines

    loaded = checkpoint.load(model_dir, device=device)
    config = loaded.generation.update(beam_size=1, num_hypotheses=1)
    info = loaded.info
    src = (corpus / f"test.{info.source_language}").read_text(encoding="utf-8").splitlines()
    ref = (corpus / f"test.{info.target_language}").read_text(encoding="utf-8").splitlines()
    if limit:
        src, ref = src[:limit], ref[:limit]
    if loaded.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    hyps = translate_lines(loaded.net, loaded.tokenizer, src, config, max_rows=256)
    if loaded.device.type == "cuda":
        torch.cuda.synchronize()
    s = score(hyps, ref, time.perf_counter() - start)
    return {"direction": info.name, "bleu": s.bleu, "chrf": s.chrf, "sentences": s.sentences,
            "seconds": s.seconds, "examples": [[a, b] for a, b in zip(src[:3], hyps[:3], strict=True)]}


def wait_for(runs: list[Path], timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and any(not (r / "done.json").exists() and alive(r) for r in runs):
        time.sleep(5)


def model_tar(directory: Path) -> bytes:
    """The model directory's files as one uncompressed tar under NAME/ (float16 weights barely compress)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(directory.iterdir()):
            tar.add(path, arcname=f"{directory.parent.name}/{path.name}")
    return buf.getvalue()


def collect(args: argparse.Namespace) -> int:
    """Wait for the runs, score them and the shipped model the same way, write scores.json and weight pieces."""
    runs = [run_dir(args.work, name) for name in args.runs]
    wait_for(runs, args.timeout)
    plans = {r.name: json.loads((r / "plan.json").read_text()) for r in runs if (r / "plan.json").exists()}
    corpus = Path(next(iter(plans.values()))["corpus"]) if plans else args.work / "corpus"
    tars = {name: model_tar(run_dir(args.work, name) / "export") for name in args.weights
            if (run_dir(args.work, name) / "export" / "model.safetensors").exists()}
    pieces = sum(-(-len(t) // PIECE_BYTES) for t in tars.values())
    if pieces + 1 > MAX_FILES:
        print(f"collect: {pieces} weight pieces and scores.json are more than {MAX_FILES} files; ask for fewer "
              "--weights", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"device": args.device, "runs": {}, "pieces": {}}
    for run in runs:
        entry = {**progress(run), "plan": plans.get(run.name)}
        if (run / "export" / "model.safetensors").exists():
            entry["test"] = evaluate(run / "export", corpus, args.device, args.limit)
        report["runs"][run.name] = entry
        print(f"{run.name}: {entry['state']}, step {entry['step']}, test {entry.get('test', {}).get('bleu')}")
    if args.shipped.name != "none":
        report["shipped"] = {"path": str(args.shipped), "test": evaluate(args.shipped, corpus, args.device, args.limit)}
        print(f"shipped {args.shipped}: test {report['shipped']['test']['bleu']}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, data in tars.items():
        names = []
        for i in range(0, len(data), PIECE_BYTES):
            piece = args.out / f"{name}.tar.{i // PIECE_BYTES:02d}"
            piece.write_bytes(data[i : i + PIECE_BYTES])
            names.append(piece.name)
        report["pieces"][name] = {"files": names, "sha256": hashlib.sha256(data).hexdigest()}
    (args.out / "scores.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return 0 if all(e["state"] == "done" for e in report["runs"].values()) else 1


def join(args: argparse.Namespace) -> int:
    """Rebuild model directories OUT/NAME/ from the pieces collect wrote (checked against scores.json)."""
    report = json.loads((args.pieces / "scores.json").read_text())
    for name, entry in report["pieces"].items():
        data = b"".join((args.pieces / f).read_bytes() for f in entry["files"])
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            print(f"join: the pieces of {name} do not match their checksum", file=sys.stderr)
            return 1
        args.out.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(args.out, filter="data")
        print(f"{args.out / name}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack-corpus", help="the corpus as one .tar.xz")
    p.add_argument("--corpus", type=Path, default=REPO / "data/corpus")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--preset", type=int, default=6, help="xz level")
    p.add_argument("--extra", nargs="*", default=[], metavar="DIR[:N]",
                   help="folders whose train pairs join train, N times each (e.g. data/distill:2)")
    p.set_defaults(handler=pack_corpus)
    p = sub.add_parser("start", help="launch the trainings, detached, and return")
    p.add_argument("--corpus", type=Path, required=True, help="corpus directory or pack-corpus archive")
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--minutes", type=float, required=True, help="training time of each run")
    p.add_argument("--runs", nargs="+", default=[r.name for r in RUNS], choices=[r.name for r in RUNS])
    p.add_argument("--device", default="cuda")
    p.add_argument("--spm", type=Path, default=REPO / "weights/en-pt/target.spm",
                   help="the vocabulary of the runs from scratch (the shipped models' shared one)")
    p.add_argument("--dry-run", action="store_true", help="tiny architecture, a few steps: checks the path")
    p.add_argument("--init", nargs="*", default=[], metavar="RUN=MODEL_DIR",
                   help="that run starts from these weights (e.g. a previous session's model, rebuilt by join and "
                        "carried): training accumulates across GPU sessions")
    p.set_defaults(handler=start)
    p = sub.add_parser("worker", help=argparse.SUPPRESS)
    p.add_argument("run", type=Path)
    p.set_defaults(handler=worker)
    p = sub.add_parser("status", help="progress of each run")
    p.add_argument("--work", type=Path, required=True)
    p.set_defaults(handler=status)
    p = sub.add_parser("collect", help="wait, score on the test split, write scores.json and weight pieces")
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--runs", nargs="+", required=True, help="runs to wait for and score")
    p.add_argument("--weights", nargs="*", default=[], help="runs whose exported model comes back in pieces")
    p.add_argument("--timeout", type=float, default=540, help="seconds to wait for the runs")
    p.add_argument("--device", default="cuda")
    p.add_argument("--shipped", type=Path, default=REPO / "weights/en-pt", help="scored alongside; 'none': not")
    p.add_argument("--limit", type=int, default=0, help="only the first N test sentences (0 = all)")
    p.set_defaults(handler=collect)
    p = sub.add_parser("join", help="rebuild model directories from collect's pieces")
    p.add_argument("--pieces", type=Path, required=True, help="the folder collect wrote")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(handler=join)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
