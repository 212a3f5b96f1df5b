"""Generation settings: one frozen record per request, checked once by validate()."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

MAX_BEAM_SIZE = 16
MAX_NEW_TOKENS = 1024
# What each field's annotation accepts, and how a message names it. A bool is never taken for a number.
ACCEPTED: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "an integer"),
    "float": ((int, float), "a number"),
    "bool": ((bool,), "true or false"),
    "int | None": ((int, type(None)), "an integer or null"),
}


@dataclass(frozen=True)
class GenerationConfig:
    """How one source sentence is decoded. Every row of a batch may carry a different one."""

    beam_size: int = 1  # 1 = greedy or sampling; >1 = beam search occupying beam_size cache rows
    num_hypotheses: int = 1  # n-best returned (at most beam_size)
    length_penalty: float = 1.0  # beam scores are divided by length ** length_penalty
    do_sample: bool = False  # sample instead of taking the most likely token (beam_size must be 1)
    temperature: float = 1.0  # 0.01 to 100; divides the logits before sampling
    top_k: int = 0  # sample among the k most likely tokens; 0 = all
    top_p: float = 1.0  # sample within the smallest set of tokens whose probability reaches p; 1 = all
    seed: int | None = None  # makes sampling reproducible, whatever else shares the batch
    repetition_penalty: float = 1.0  # > 1 discourages tokens already generated (CTRL-style)
    no_repeat_ngram_size: int = 0  # forbid repeating any n-gram of this size; 0 = off
    min_new_tokens: int = 0  # end-of-sentence is forbidden before this many tokens
    max_new_tokens: int = 256  # hard cap on generated tokens, end-of-sentence included
    scores: bool = True  # compute token log-probs and hypothesis scores; False: greedy rows skip it (NaN instead)
    alignment: bool = False  # each hypothesis also gives the source token each of its tokens attends to most
    # the server writes a generated unknown token as the source piece it attends to most (argostranslate's
    # replace_unknowns, CTranslate2's option of that name); such rows compute the alignment
    replace_unknowns: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field: its type first, then its range."""
        for f in fields(self):
            value = getattr(self, f.name)
            types, kind = ACCEPTED[str(f.type)]
            if not isinstance(value, types) or isinstance(value, bool) != (types == (bool,)):
                raise ValueError(f"{f.name} must be {kind}, got {value!r}")
        checks: list[tuple[str, bool, str]] = [
            ("beam_size", 1 <= self.beam_size <= MAX_BEAM_SIZE, f"must be between 1 and {MAX_BEAM_SIZE}"),
            ("num_hypotheses", 1 <= self.num_hypotheses <= self.beam_size, "must be between 1 and beam_size"),
            ("length_penalty", -10.0 <= self.length_penalty <= 10.0, "must be between -10 and 10"),
            ("do_sample", not (self.do_sample and self.beam_size > 1), "sampling needs beam_size 1"),
            # Logits divided by less overflow (1e-308 is 0 in float32): for the likeliest token, sample no more.
            ("temperature", 0.01 <= self.temperature <= 100.0, "must be between 0.01 and 100 (for the likeliest "
                                                                "tokens always, do_sample false)"),
            ("top_k", 0 <= self.top_k < 2**31, "must be between 0 and 2**31 - 1"),
            ("top_p", 0.0 < self.top_p <= 1.0, "must be > 0 and <= 1"),
            ("seed", self.seed is None or 0 <= self.seed < 2**63, "must be a non-negative integer"),
            ("repetition_penalty", 0.01 <= self.repetition_penalty <= 10.0, "must be between 0.01 and 10"),
            ("no_repeat_ngram_size", 0 <= self.no_repeat_ngram_size <= 16, "must be between 0 and 16"),
            ("max_new_tokens", 1 <= self.max_new_tokens <= MAX_NEW_TOKENS, f"must be between 1 and {MAX_NEW_TOKENS}"),
            ("min_new_tokens", 0 <= self.min_new_tokens <= self.max_new_tokens, "must be between 0 and max_new_tokens"),
        ]
        for name, ok, message in checks:
            if not ok:
                raise ValueError(f"{name} {message}, got {getattr(self, name)!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def update(self, **changes: Any) -> GenerationConfig:
        """A copy with some fields changed (validated); unknown names raise ValueError."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown generation setting(s): {', '.join(unknown)}")
        return replace(self, **changes)
