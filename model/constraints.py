"""Lexical constraints: what must appear in a sentence's output (a glossary's target terms).

A sentence's constraints are unordered: each must appear once, anywhere. A constraint is a list of alternative token
sequences ("arquivo", "Arquivo"), any one of which meets it. `Progress` is one hypothesis's state: which constraints
are met, and the one being written with how many of its tokens are out. Only one constraint is in progress at a time
(a simplification of fairseq's trie of unordered constraints); a hypothesis that leaves a constraint half written
has not met it and may start it again later. Every constraint must be met within `limit` tokens: LENGTH_RATIO target
tokens per source token, plus the constraints' own, or max_new_tokens if smaller.

Greedy (and sampled) rows follow `Constraints.choose`: a constraint once started is continued; one starts when the
model's own token is its first token, or when its first token is within START_MARGIN of the model's best logit, or
when the row has attended to the constraint's source words for two steps (when they are known: `sources`);
when the model wants to end the sentence, or the tokens still owed only just fit the limit, the unmet constraint the
model likes best is forced, and a row forced where it wanted to end ends as soon as every constraint is met (left
to go on, the model tended to write the sentence again after the term).

Beam search (`select_beams`) is a much simplified dynamic beam allocation (Post & Vilar 2018): each beam's candidates
are its best tokens plus the tokens that advance its constraints; a candidate that owes more tokens than the limit
still holds is dropped (so the constraints always fit); the k best candidates go on, except that the most advanced
one (most constraint tokens written) always keeps a place, taking the k-th's. A hypothesis ends when its
end-of-sentence ranks among the k best candidates that meet every constraint, and the search stops once no beam
still going scores above the best ended one (model.search). DBA proper splits the beam into banks of equal progress;
with the small beams served here (4) the banks took places from the hypotheses the model prefers: on 300 sentences
of the shipped model's test split chrF fell 2.6 points below this rule's, and outputs whose terms the model wrote
anyway changed.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Nats: a greedy row starts a constraint whose first token scores this close to the model's best choice, so a term
# the model nearly chose goes where the model was about to write its own word, not at the end of the sentence.
START_MARGIN = 2.0
# Nats: the same, without bound, once the row has attended to the term's own source words for two steps running
# (when the constraint knows them): the model is translating that term now, whatever word of its own it prefers,
# even one it would never write ("ficheiro" where it writes "arquivo"). One step is not enough: an article or
# preposition before the noun already looks at the noun's source word. (bench/glossary.py --limit 500: a margin
# of 8 nats left 47.5% of the terms the model did not want at the end of the sentence, none 41.7%, chrF alike.)
ALIGNED_MARGIN = math.inf
# A sentence's constraints must be met within this many target tokens per source token (plus the constraints' own):
# beams that wander without meeting them are forced back before they run to max_new_tokens.
LENGTH_RATIO = 2
DEAD = -1e8  # a beam's score below this is a placeholder beam (not yet expanded), never a real hypothesis


Term = Sequence[Sequence[int]]  # one constraint: alternatives ("arquivo", "Arquivo"), any one of which meets it


@dataclass(frozen=True)
class Progress:
    """One hypothesis's way through its constraints."""

    met: tuple[bool, ...]  # per constraint
    current: int = -1  # the constraint being written; -1: none
    alternative: int = 0  # which of its alternatives
    written: int = 0  # its tokens out so far
    ending: bool = False  # greedy: a constraint was forced where the model wanted to end; end once all are met


class Constraints:
    """The constraints of one sentence, each a list of alternative non-empty token sequences, to appear in the
    output (one alternative of each)."""

    def __init__(self, terms: Sequence[Term], sources: Sequence[Sequence[int]] | None = None) -> None:
        """`sources`: per constraint, the positions of the source tokens it translates (a glossary term's source
        words), or None when they are not known."""
        if not terms or any(not alts or any(not a for a in alts) for alts in terms):
            raise ValueError("constraints must be non-empty lists of non-empty token sequences")
        if any(not isinstance(i, int) or i < 0 for alts in terms for a in alts for i in a):
            raise ValueError("constraint tokens must be non-negative integer ids")
        if sources is not None and len(sources) != len(terms):
            raise ValueError("need the source positions of every constraint, or none")
        self.terms = [[list(a) for a in alts] for alts in terms]
        self.sources = [frozenset(x) for x in sources] if sources is not None else None
        self.shortest = [min(len(a) for a in alts) for alts in self.terms]

    def start(self) -> Progress:
        return Progress((False,) * len(self.terms))

    def satisfied(self, p: Progress) -> bool:
        return all(p.met)

    def tokens(self) -> list[int]:
        return [t for alts in self.terms for a in alts for t in a]

    def owed(self, p: Progress) -> int:
        """Tokens still to write for the unmet constraints (their shortest alternatives)."""
        left = sum(n for n, m in zip(self.shortest, p.met, strict=True) if not m)
        if p.current >= 0:
            left += len(self.terms[p.current][p.alternative]) - self.shortest[p.current] - p.written
        return left

    def written(self, p: Progress) -> int:
        """Tokens of constraints written so far: the hypothesis's bank in beam search."""
        return sum(n for n, m in zip(self.shortest, p.met, strict=True) if m) + p.written

    def next_tokens(self, p: Progress) -> list[int]:
        """The tokens that advance the constraints: the next of the one in progress, else the first of each unmet."""
        if p.current >= 0:
            return [self.terms[p.current][p.alternative][p.written]]
        return list(dict.fromkeys(a[0] for alts, m in zip(self.terms, p.met, strict=True) if not m for a in alts))

    def advance(self, p: Progress, token: int) -> Progress:
        """The progress after writing `token`."""
        if p.current >= 0:
            alts, n = self.terms[p.current], p.written
            done = alts[p.alternative][:n]
            for j, a in enumerate(alts):  # the same alternative, or another one with the same beginning
                if len(a) > n and a[n] == token and a[:n] == done:
                    if n + 1 < len(a):
                        return Progress(p.met, p.current, j, n + 1, p.ending)
                    return Progress(_with(p.met, p.current), ending=p.ending)
            p = Progress(p.met, ending=p.ending)  # left half written: not met; this token may start another
        for i, (alts, met) in enumerate(zip(self.terms, p.met, strict=True)):
            for j, a in enumerate(alts):
                if not met and a[0] == token:
                    return Progress(_with(p.met, i), ending=p.ending) if len(a) == 1 else Progress(
                        p.met, i, j, 1, p.ending)
        return p

    def translating(self, p: Progress, looking: Sequence[int]) -> list[int]:
        """The first tokens of the unmet constraints whose source words hold every position of `looking`, each
        constraint's alternatives in their order (a glossary gives the term as written first)."""
        if not looking or self.sources is None:
            return []
        return [a[0] for alts, met, src in zip(self.terms, p.met, self.sources, strict=True)
                if not met and all(x in src for x in looking) for a in alts]

    def limit(self, src_len: int, max_new: int) -> int:
        """The length by which every constraint must be met."""
        return min(max_new, LENGTH_RATIO * src_len + self.owed(self.start()))

    def pending(self, p: Progress) -> bool:
        """Whether a greedy row still needs `choose`: constraints unmet, or an end it owes."""
        return p.ending or not all(p.met)

    def choose(self, p: Progress, token: int, best: float, starts: dict[int, float], budget: int,
               eos: int, looking: Sequence[int] = ()) -> tuple[int, Progress]:
        """A greedy row's token, the model's `token` (best logit `best`) or a constraint's, and the progress to keep
        until the row's token is recorded (`ending` set when a constraint is forced where the model wanted to end).

        `starts`: the logit of each token of `next_tokens(p)`; `budget`: tokens the row may still write, this one
        included; `looking`: the source positions the row attended to most at the previous step and this one, when
        known.
        """
        if self.satisfied(p):
            return (eos, p) if p.ending else (token, p)
        if p.current >= 0:
            return self.terms[p.current][p.alternative][p.written], p
        if token in starts:
            return token, p
        liked = max(starts, key=lambda t: starts[t])
        if token == eos:
            return liked, Progress(p.met, ending=True)
        here = self.translating(p, looking)
        if here:  # the row is on a term's source words: the term as given ("ficheiro", not "Ficheiro" mid-sentence)
            mine = here[0]
            if starts[mine] >= best - ALIGNED_MARGIN:
                return mine, p
        if self.owed(p) >= budget or starts[liked] >= best - START_MARGIN:
            return liked, p
        return token, p


def _with(met: tuple[bool, ...], i: int) -> tuple[bool, ...]:
    return met[:i] + (True,) + met[i + 1:]


@dataclass(frozen=True)
class Pick:
    beam: int  # the beam it continues
    token: int
    score: float
    progress: Progress


def select_beams(
    c: Constraints, k: int, scores: list[float], progress: list[Progress], options: list[list[tuple[int, float]]],
    eos: int, budget: int,
) -> tuple[list[Pick], list[tuple[int, float]]]:
    """One beam-search step of a constrained sentence, on the host.

    `scores[b]`, `progress[b]`: beam b's running log-prob and constraint state; `options[b]`: (token, log-prob) of
    its candidates; `budget`: tokens that may follow this step's. Returns the k beams that go on, best first, and the
    (beam, score) of hypotheses that end here with every constraint met.
    """
    seen: set[tuple[int, int]] = set()
    valid: list[Pick] = []
    spare: list[Pick] = []  # dead, over budget or ending unmet: used only if too few valid candidates remain
    ends: list[Pick] = []
    for b, (score, p) in enumerate(zip(scores, progress, strict=True)):
        for token, logprob in options[b]:
            if (b, token) in seen:
                continue
            seen.add((b, token))
            pick = Pick(b, token, score + logprob, p if token == eos else c.advance(p, token))
            if token == eos:
                (ends if c.satisfied(p) and score > DEAD else spare).append(pick)
            elif score <= DEAD or c.owed(pick.progress) > budget:
                spare.append(pick)
            else:
                valid.append(pick)
    # a hypothesis ends when its end-of-sentence ranks among the k best candidates that meet every constraint
    ranked = sorted([x for x in valid if c.satisfied(x.progress)] + ends, key=lambda x: -x.score)[:k]
    finished = [(x.beam, x.score) for x in ranked if x.token == eos]
    valid.sort(key=lambda x: -x.score)
    picks = valid[:k]
    if picks:  # the most advanced candidate (the best of them) goes on, in place of the k-th
        ahead = max(valid, key=lambda x: c.written(x.progress))
        if c.written(ahead.progress) > max(c.written(x.progress) for x in picks):
            picks[-1] = ahead  # (fewer than k valid candidates would all be picks already)
    spare = [x for x in sorted(spare, key=lambda x: -x.score) if x.token != eos]
    picks += spare[: k - len(picks)]
    return sorted(picks, key=lambda x: -x.score), finished
