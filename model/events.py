"""The records a decode batch emits, which reach the HTTP route as they are (they also cross a process pipe).

A sentence is known by its `SentenceKey`, (request, sentence): the request that sent it and its index there.
"""

from __future__ import annotations

from dataclasses import dataclass

SentenceKey = tuple[int, int]  # (request, sentence)


@dataclass
class Hypothesis:
    tokens: list[int]  # generated tokens, end-of-sentence excluded
    score: float  # beam search: length-normalised log-probability; otherwise the sum of token log-probs
    finish_reason: str  # "eos" | "length"
    # with GenerationConfig.alignment: per token, the source position its cross-attention weighs most
    alignment: list[int] | None = None


@dataclass
class TokenEvent:
    """One token of a sentence decoded without beams, as soon as it is chosen."""

    request: int
    sentence: int
    token: int
    logprob: float
    source: int | None = None  # the source position it attends to most, when its sequence computes alignment

    @property
    def key(self) -> SentenceKey:
        return (self.request, self.sentence)


@dataclass
class FinishEvent:
    """A sentence's n-best list, best first; its rows have left the batch."""

    request: int
    sentence: int
    hypotheses: list[Hypothesis]  # best first
    finish_reason: str  # "eos" | "length", that of the best hypothesis

    @property
    def key(self) -> SentenceKey:
        return (self.request, self.sentence)


Event = TokenEvent | FinishEvent
