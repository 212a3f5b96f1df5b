"""Deduplication and the dev/test hold-out, grouped by source sentence.

All pairs sharing a normalised English source form one group; a group goes
entirely to one split, so no source sentence appears in two splits.  Held-out
splits keep one reference per source and are drawn across corpus sources with
a fixed seed, preferring sentence-like segments.
"""

from __future__ import annotations

import math
import random
import re
from collections import defaultdict
from collections.abc import Iterable

from .clean import letter_fraction, tokens
from .pairs import Pair

EVAL_MIN_WORDS = 4
EVAL_MAX_WORDS = 60


def source_key(text: str) -> str:
    """Grouping key: case-folded words only (punctuation/spacing ignored)."""
    return re.sub(r"[\W_]+", " ", text.casefold()).strip()


def dedup(pairs: Iterable[Pair], max_per_source: int = 3) -> list[Pair]:
    """Drop exact (en, pt) duplicates and cap translations per source sentence."""
    seen: set[tuple[str, str]] = set()
    per_source: dict[str, int] = defaultdict(int)
    out: list[Pair] = []
    for pair in pairs:
        if (pair.en, pair.pt) in seen:
            continue
        key = source_key(pair.en)
        if per_source[key] >= max_per_source:
            continue
        seen.add((pair.en, pair.pt))
        per_source[key] += 1
        out.append(pair)
    return out


def eval_eligible(pair: Pair) -> bool:
    """Sentence-like pairs suitable for dev/test scoring."""
    n = tokens(pair.en)
    return (EVAL_MIN_WORDS <= n <= EVAL_MAX_WORDS and tokens(pair.pt) >= 3
            and letter_fraction(pair.en) >= 0.75)


def _quotas(available: dict[str, int], total: int) -> dict[str, int]:
    """Share ``total`` across sources proportionally to sqrt(availability)."""
    quotas = {s: 0 for s in available}
    remaining = total
    open_sources = {s for s, n in available.items() if n > 0}
    while remaining > 0 and open_sources:
        weight = sum(math.sqrt(available[s]) for s in open_sources)
        grant = {s: max(1, int(remaining * math.sqrt(available[s]) / weight)) for s in open_sources}
        for source in sorted(open_sources):
            take = min(grant[source], available[source] - quotas[source], remaining)
            quotas[source] += take
            remaining -= take
        open_sources = {s for s in open_sources if quotas[s] < available[s]}
    return quotas


def split_by_source(pairs: list[Pair], sizes: dict[str, int], seed: int = 1234) -> dict[str, list[Pair]]:
    """Split into ``train`` plus the held-out splits named in ``sizes``.

    ``sizes`` maps split name to size, e.g. ``{"dev": 2000, "test": 2000}``.
    """
    groups: dict[str, list[Pair]] = defaultdict(list)
    for pair in pairs:
        groups[source_key(pair.en)].append(pair)
    by_origin: dict[str, list[str]] = defaultdict(list)
    for key in sorted(groups):
        first = groups[key][0]
        if eval_eligible(first):
            by_origin[first.source].append(key)
    rng = random.Random(seed)
    for keys in by_origin.values():
        rng.shuffle(keys)
    result: dict[str, list[Pair]] = {name: [] for name in sizes}
    taken: set[str] = set()
    for name, size in sizes.items():
        avail = {o: len([k for k in keys if k not in taken]) for o, keys in by_origin.items()}
        for origin, quota in sorted(_quotas(avail, size).items()):
            chosen = [k for k in by_origin[origin] if k not in taken][:quota]
            taken.update(chosen)
            result[name].extend(groups[k][0] for k in chosen)
        rng.shuffle(result[name])
    result["train"] = [p for k, g in groups.items() if k not in taken for p in g]
    rng.shuffle(result["train"])
    return result


def add_train_only(splits: dict[str, list[Pair]], extra: list[Pair], held_out: dict[str, int],
                   seed: int = 1234) -> dict[str, list[Pair]]:
    """Join pairs of sources that came after the dev and test splits were drawn, leaving those splits as they are.

    A pair whose source sentence is held out in any split is dropped; so is one already in train. `held_out` names
    new evaluation splits and their sizes, drawn from these pairs alone (one reference per source sentence, sentence
    -like pairs whose source sentence the existing splits do not have); the rest join train.
    """
    known = {name: {source_key(p.en) for p in pairs} for name, pairs in splits.items()}
    evaluation = set().union(*(keys for name, keys in known.items() if name != "train"))
    in_train = {(p.en, p.pt) for p in splits["train"]}
    groups: dict[str, list[Pair]] = defaultdict(list)
    for pair in extra:
        key = source_key(pair.en)
        if key not in evaluation and (pair.en, pair.pt) not in in_train:
            groups[key].append(pair)
    rng = random.Random(seed)
    candidates = sorted(k for k, g in groups.items() if k not in known["train"] and eval_eligible(g[0]))
    rng.shuffle(candidates)
    out = dict(splits)
    start = 0
    for name, size in held_out.items():
        out[name] = [groups[k][0] for k in candidates[start:start + size]]
        start += size
    taken = set(candidates[:start])
    train = splits["train"] + [p for k, g in groups.items() if k not in taken for p in g]
    rng.shuffle(train)
    out["train"] = train
    return out
