"""Lexical constraints: token sequences that must each appear in a sentence's output (a glossary's target terms).

A row's constraints are unordered: each must appear once, anywhere. `Progress` is one hypothesis's state: which
constraints are met, and the one being written with how many of its tokens are out. Only one constraint is in
progress at a time (a simplification of fairseq's trie of unordered constraints); a hypothesis that leaves a
constraint half written has not met it and may start it again later.

Greedy (and sampled) rows follow `Constraints.choose`: a constraint once started is continued; one starts when the
model's own token is its first token, or when its first token is within `START_MARGIN` of the model's best logit;
when the model wants to end the sentence, or the tokens still owed only just fit the remaining length, the unmet
constraint the model likes best is forced.

Beam search (`select_beams`) is a much simplified dynamic beam allocation (Post & Vilar 2018): each beam's candidates
are its best tokens plus the tokens that advance its constraints; a hypothesis may end only with every constraint
met, and a candidate that owes more tokens than the length budget still holds is dropped (so the constraints always
fit); the k best candidates go on, except that the most advanced one (most constraint tokens written) always keeps a
place, taking the k-th's. DBA proper splits the beam into banks of equal progress; with the small beams served here
(4 to 5) that took places from the hypotheses the model prefers: in the tests it changed outputs whose terms the
model wrote anyway, which this rule leaves alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Nats: a greedy row starts a constraint whose first token scores this close to the model's best choice, so a term
# the model nearly chose goes where the model was about to write its own word, not at the end of the sentence.
START_MARGIN = 2.0
DEAD = -1e8  # a beam's score below this is a placeholder beam (not yet expanded), never a real hypothesis


@dataclass(frozen=True)
class Progress:
    """One hypothesis's way through its constraints."""

    met: tuple[bool, ...]  # per constraint
    current: int = -1  # the constraint being written; -1: none
    written: int = 0  # its tokens out so far


class Constraints:
    """The constraints of one sentence: non-empty token-id sequences, each to appear in the output."""

    def __init__(self, terms: Sequence[Sequence[int]]) -> None:
        if not terms or any(not t for t in terms):
            raise ValueError("constraints must be non-empty token sequences")
        if any(not isinstance(i, int) or i < 0 for t in terms for i in t):
            raise ValueError("constraint tokens must be non-negative integer ids")
        self.terms = [list(t) for t in terms]

    def start(self) -> Progress:
        return Progress((False,) * len(self.terms))

    def satisfied(self, p: Progress) -> bool:
        return all(p.met)

    def owed(self, p: Progress) -> int:
        """Tokens still to write for the unmet constraints."""
        left = sum(len(t) for t, m in zip(self.terms, p.met, strict=True) if not m)
        return left - p.written

    def written(self, p: Progress) -> int:
        """Tokens of constraints written so far: the hypothesis's bank in beam search."""
        return sum(len(t) for t, m in zip(self.terms, p.met, strict=True) if m) + p.written

    def next_tokens(self, p: Progress) -> list[int]:
        """The tokens that advance the constraints: the next of the one in progress, else the first of each unmet."""
        if p.current >= 0:
            return [self.terms[p.current][p.written]]
        return list(dict.fromkeys(t[0] for t, m in zip(self.terms, p.met, strict=True) if not m))

    def advance(self, p: Progress, token: int) -> Progress:
        """The progress after writing `token`."""
        if p.current >= 0:
            term = self.terms[p.current]
            if token == term[p.written]:
                if p.written + 1 < len(term):
                    return Progress(p.met, p.current, p.written + 1)
                return Progress(_with(p.met, p.current))
            p = Progress(p.met)  # left half written: not met; this token may start another
        for i, (term, met) in enumerate(zip(self.terms, p.met, strict=True)):
            if not met and term[0] == token:
                return Progress(_with(p.met, i)) if len(term) == 1 else Progress(p.met, i, 1)
        return p

    def choose(self, p: Progress, token: int, best: float, starts: dict[int, float], budget: int, eos: int) -> int:
        """A greedy row's token: the model's `token` (best logit `best`), or a constraint's.

        `starts`: the logit of each token of `next_tokens(p)`; `budget`: tokens the row may still write, this one
        included.
        """
        if self.satisfied(p):
            return token
        if p.current >= 0:
            return self.terms[p.current][p.written]
        if token in starts:
            return token
        liked = max(starts, key=lambda t: starts[t])
        if token == eos or self.owed(p) >= budget or starts[liked] >= best - START_MARGIN:
            return liked
        return token


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
    # a hypothesis ends when its end-of-sentence ranks among the k best candidates of all, as in plain beam search
    ranked = sorted(valid + ends + spare, key=lambda x: -x.score)[:k]
    finished = [(x.beam, x.score) for x in ranked if x.token == eos and x in ends]
    valid.sort(key=lambda x: -x.score)
    picks = valid[:k]
    if picks:  # the most advanced candidate (the best of them) goes on, in place of the k-th
        ahead = max(valid, key=lambda x: c.written(x.progress))
        if c.written(ahead.progress) > max(c.written(x.progress) for x in picks):
            picks[-1] = ahead  # (fewer than k valid candidates would all be picks already)
    spare = [x for x in sorted(spare, key=lambda x: -x.score) if x.token != eos]
    picks += spare[: k - len(picks)]
    return sorted(picks, key=lambda x: -x.score), finished
