"""`tolk pull ID`: download a Hugging Face Marian (OPUS-MT) checkpoint, or an Argos package (`argos:FROM-TO`,
`model.argos`), and import it, in one step.

huggingface_hub does the downloading: its cache makes a pull resumable and a second pull free, and it honours
HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE. Only the files an import reads are fetched. The model directory is
written beside its destination and renamed into place, so a failed pull leaves nothing half-written there.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from model import checkpoint
from model.marian import import_marian, languages
from model.marian_format import UnsupportedCheckpoint, read_json

# What import_marian reads; pytorch_model.bin only where there is no model.safetensors (see pull)
MARIAN_FILES = ["config.json", "generation_config.json", "tokenizer_config.json", "source.spm", "target.spm",
                "vocab.json", "target_vocab.json", "README.md"]


def pull(repo_id: str, out: Path | None = None, weights_dir: Path = Path("weights"), revision: str | None = None,
         force: bool = False) -> Path:
    """The model directory of a Hub repository, downloaded and imported (or already there); raises ValueError with
    a message for the user when it cannot be."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    name = repo_id.rstrip("/").rsplit("/", 1)[-1]
    out = out if out is not None else weights_dir / name
    if (out / "config.json").is_file() and not force:
        return out
    if out.exists() and any(out.iterdir()) and not force:
        raise ValueError(f"{out} exists and is not a model directory (use --force to replace it)")
    try:
        files = {s.rfilename for s in HfApi().model_info(repo_id, revision=revision).siblings or []}
        weights = "model.safetensors" if "model.safetensors" in files else "pytorch_model.bin"
        if weights not in files or "config.json" not in files:
            raise ValueError(f"{repo_id} is not a Marian checkpoint: it has no config.json and weights")
        snapshot = Path(snapshot_download(repo_id, revision=revision, allow_patterns=[*MARIAN_FILES, weights]))
    except RepositoryNotFoundError as e:
        raise ValueError(f"no model repository {repo_id!r} (or it is private: set HF_TOKEN)") from e
    except LocalEntryNotFoundError as e:
        raise ValueError(f"cannot download {repo_id}: no network, and it is not in the Hugging Face cache") from e
    except HfHubHTTPError as e:
        raise ValueError(f"downloading {repo_id} failed: {e}") from e
    # the snapshot's directory is named by its commit: the languages come from the repository's name instead
    source, target = languages(snapshot, read_json(snapshot / "tokenizer_config.json"), name)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp:
        staged = Path(tmp) / "model"
        try:
            import_marian(snapshot, staged, name, source, target)
        except UnsupportedCheckpoint as e:
            raise ValueError(f"{repo_id}: {e}") from e
        if out.exists():
            shutil.rmtree(out)
        staged.rename(out)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("repo", metavar="ID", help="a Hugging Face Marian repository (e.g. Helsinki-NLP/opus-mt-en-de), or "
                                           "argos:FROM-TO for an Argos (LibreTranslate) package (e.g. argos:en-de)")
    p.add_argument("--to", type=Path, default=None, help="the model directory (default: weights/<name>)")
    p.add_argument("--revision", default=None, help="a branch, tag or commit (default: main; Hub repositories)")
    p.add_argument("--force", action="store_true", help="import again over an existing directory")


def main(args: argparse.Namespace) -> int:
    try:
        if args.repo.startswith("argos:"):
            from model.argos import pull_argos

            out = pull_argos(args.repo.removeprefix("argos:"), args.to, force=args.force)
        else:
            out = pull(args.repo, args.to, revision=args.revision, force=args.force)
    except (ValueError, OSError) as e:
        print(f"tolk pull: error: {e}", file=sys.stderr)
        return 1
    info = checkpoint.ModelInfo.load(out / "info.json")
    print(f"{args.repo} -> {out} ({info.source_language} -> {info.target_language})")
    return 0
