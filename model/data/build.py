"""``tolk data build``: download, extract, align, clean and split the corpus.

Each source step downloads (``apt-get download``) and extracts (``dpkg-deb``)
its packages under ``<work>`` - both cached, so re-runs only re-parse - and
saves raw pairs to ``<work>/pairs/<source>.tsv``; the final step cleans,
deduplicates, holds out dev/test by source sentence and writes ``<out>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import Counter
from pathlib import Path

from . import apt
from .clean import reject_reason, tokens
from .commands import leave_out_described
from .notice import notice_line
from .pairs import Pair, pairs_path, read_pairs, write_pairs
from .sources import ddtp, firefox, gettext_catalogs, kde_docbook, libreoffice, mallard_help
from .split import add_train_only, dedup, split_by_source

SOURCES = ("gettext", "libreoffice", "ddtp", "firefox", "mallard", "kde")
# Sources added after the dev and test splits were drawn, in the order they came: they join train, so that dev and
# test stay the same sentences and every score measured on them stays comparable. The first one also gives a held-out
# split of its own, "prose", which later ones leave as it is.
TRAIN_ONLY = ("mallard", "kde")
SPLITS = ("train", "dev", "test", "prose")

log = logging.getLogger("tolk.data")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``data build`` options on ``parser``."""
    parser.add_argument("--out", type=Path, default=Path("data/corpus"),
                        help="output directory for {train,dev,test}.{en,pt}, NOTICE, stats.json")
    parser.add_argument("--work", type=Path, default=Path("data/work"),
                        help="download/extraction directory (resumable)")
    parser.add_argument("--sources", default=",".join(SOURCES),
                        help=f"comma-separated subset of {','.join(SOURCES)}")
    parser.add_argument("--max-catalogs", type=int, default=100,
                        help="keep the N packages with the most pt_BR gettext pairs")
    parser.add_argument("--dev-size", type=int, default=2000)
    parser.add_argument("--test-size", type=int, default=2000)
    parser.add_argument("--prose-size", type=int, default=500,
                        help="pairs of GNOME's user help held out as the prose split (bench/quality.py)")
    parser.add_argument("--max-per-source", type=int, default=3,
                        help="maximum distinct translations kept per English source")
    parser.add_argument("--max-tokens", type=int, default=250,
                        help="maximum whitespace tokens per side")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--refresh", action="store_true",
                        help="re-run apt-get update on the private apt lists")


def _collect(name: str, env: apt.AptEnv, work: Path, args: argparse.Namespace) -> tuple[list[Pair], list[str]]:
    """Run one source step; returns its pairs and the packages it used."""
    if name == "gettext":
        return gettext_catalogs.collect(env, work, args.max_catalogs)
    if name == "libreoffice":
        return libreoffice.collect(env, work), list(libreoffice.PACKAGES)
    if name == "ddtp":
        return ddtp.collect(env), []
    if name == "firefox":
        return firefox.collect(env, work), [firefox.EN_PACKAGE, firefox.PT_PACKAGE]
    if name == "mallard":
        return mallard_help.collect(env, work)
    if name == "kde":
        return kde_docbook.collect(env, work)
    raise ValueError(f"unknown source {name!r}")


def run_source(name: str, env: apt.AptEnv, work: Path, args: argparse.Namespace) -> list[Pair]:
    """Collect one source and save its raw pairs under ``<work>/pairs``.

    Downloads and extractions are cached, so re-running a step only re-parses.
    """
    started = time.monotonic()
    pairs, packages = _collect(name, env, work, args)
    path = pairs_path(work, name)
    write_pairs(path, pairs)
    path.with_suffix(".packages").write_text("".join(p + "\n" for p in packages))
    log.info("%s: %d raw pairs in %.0fs", name, len(pairs), time.monotonic() - started)
    return list(read_pairs(path, name))


def clean_pairs(pairs: list[Pair], max_tokens: int) -> tuple[list[Pair], Counter[str]]:
    """Apply the filters; returns kept pairs and a count of rejection reasons."""
    kept: list[Pair] = []
    reasons: Counter[str] = Counter()
    for pair in pairs:
        reason = reject_reason(pair.en, pair.pt, max_tokens=max_tokens)
        if reason is None:
            kept.append(pair)
        else:
            reasons[reason] += 1
    return kept, reasons


def write_splits(out: Path, splits: dict[str, list[Pair]]) -> None:
    """Write aligned ``<split>.en`` / ``<split>.pt`` files."""
    out.mkdir(parents=True, exist_ok=True)
    for name, pairs in splits.items():
        for lang in ("en", "pt"):
            tmp = out / f"{name}.{lang}.tmp"
            with tmp.open("w", encoding="utf-8") as handle:
                handle.writelines(getattr(p, lang) + "\n" for p in pairs)
            tmp.replace(out / f"{name}.{lang}")


def split_stats(pairs: list[Pair]) -> dict[str, object]:
    """Pair and whitespace-token counts, overall and per source."""
    return {
        "pairs": len(pairs),
        "en_tokens": sum(tokens(p.en) for p in pairs),
        "pt_tokens": sum(tokens(p.pt) for p in pairs),
        "by_source": dict(sorted(Counter(p.source for p in pairs).items())),
    }


def write_notice(out: Path, env: apt.AptEnv, work: Path, used: dict[str, list[str]]) -> None:
    """NOTICE: every source package with version and licence summary."""
    lines = [
        "Tolk English->Brazilian Portuguese corpus: sources",
        "",
        "Built from Debian binary packages (human translations). Each line:",
        "package<TAB>version<TAB>licences (summarised from usr/share/doc/PKG/copyright).",
        "",
    ]
    for source, packages in used.items():
        lines.append(f"[{source}]")
        if source == "ddtp":
            lines.append(_ddtp_notice(env))
        for package in packages:
            deb = next(iter(sorted(env.debs.glob(f"{package}_*.deb"))), None)
            if deb is not None:
                lines.append(notice_line(package, deb, work / "extract" / package))
        lines.append("")
    (out / "NOTICE").write_text("\n".join(lines), encoding="utf-8")


def _ddtp_notice(env: apt.AptEnv) -> str:
    files = [_index_label(p.name) for p in ddtp.index_files(env.lists, "pt_BR")]
    return ("Debian Description Translation Project (DDTP) indexes "
            f"{', '.join(files)} joined with Translation-en on Description-md5; "
            "package descriptions are part of each package's metadata (licences of the "
            "respective packages; translations contributed to Debian via DDTP/DDTSS)")


def _index_label(filename: str) -> str:
    """``<host>_<path>_dists_bookworm_main_i18n_X`` -> ``bookworm/main/i18n/X``."""
    tail = filename.split("_dists_", 1)[-1]
    return tail.replace("%5f", "\0").replace("_", "/").replace("\0", "_")


def join_train_only(splits: dict[str, list[Pair]], later: dict[str, list[Pair]], prose_size: int,
                    max_per_source: int, seed: int) -> tuple[dict[str, list[Pair]], int]:
    """The TRAIN_ONLY sources' pairs join train in TRAIN_ONLY's order; the first also holds out `prose`, which the
    later ones leave as it is. Returns the splits and how many of these pairs were left after deduplication."""
    extra = 0
    for name in (n for n in TRAIN_ONLY if n in later):
        pairs = dedup(later[name], max_per_source)
        held = {"prose": prose_size} if name == TRAIN_ONLY[0] else {}
        splits = add_train_only(splits, pairs, held, seed)
        extra += len(pairs)
    return splits, extra


def main(args: argparse.Namespace) -> int:
    """Build the corpus; returns a process exit status."""
    started = time.monotonic()
    names = [s.strip() for s in args.sources.split(",") if s.strip()]
    unknown = sorted(set(names) - set(SOURCES))
    if unknown:
        log.error("unknown sources: %s", ", ".join(unknown))
        return 2
    work, out = args.work.resolve(), args.out.resolve()
    env = apt.prepare(work / "apt", refresh=args.refresh)
    raw = {name: run_source(name, env, work, args) for name in names}
    used = {name: pairs_path(work, name).with_suffix(".packages").read_text().split()
            for name in names}
    stats: dict[str, object] = {"sources": {}}
    cleaned: list[Pair] = []
    later: dict[str, list[Pair]] = {}
    for name, pairs in raw.items():
        kept, reasons = clean_pairs(pairs, args.max_tokens)
        stats["sources"][name] = {"raw": len(pairs), "clean": len(kept),  # type: ignore[index]
                                  "rejected": dict(reasons.most_common())}
        if name in TRAIN_ONLY:
            later[name] = kept
        else:
            cleaned.extend(kept)
    unique = dedup(cleaned, args.max_per_source)
    splits = split_by_source(unique, {"dev": args.dev_size, "test": args.test_size}, args.seed)
    splits, extra = join_train_only(splits, later, args.prose_size, args.max_per_source, args.seed)
    # English commands that the Portuguese describes ("Open the file" / "Abre o arquivo") teach the third person
    # where a user wants the imperative; only train leaves them out, so dev and test stay the same sentences
    train = splits["train"]
    keep, described = leave_out_described([(p.en, p.pt) for p in train])
    splits["train"] = [train[i] for i in keep]
    write_splits(out, splits)
    write_notice(out, env, work, used)
    stats["after_dedup"] = len(unique) + extra
    stats["described_commands_left_out"] = sum(described.values())
    stats["splits"] = {name: split_stats(splits[name]) for name in SPLITS if name in splits}
    stats["packages"] = used
    stats["seconds"] = round(time.monotonic() - started)
    (out / "stats.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n")
    log.info("wrote %s: %s", out, {n: len(splits[n]) for n in SPLITS if n in splits})
    return 0


def _cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model.data.build", description=__doc__)
    add_arguments(parser)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return main(args)


if __name__ == "__main__":
    sys.exit(_cli())
