"""What passes between a model's `Scheduler` (the event loop's side) and its `Batcher` (the side that decodes).

The two may live in one process (a thread) or in two (a pipe between them); either way these typed records are
all that passes. Commands go down, `Output` and the lifecycle messages come up. The model's events
(`model.events`) travel inside `Output` as the decode batch made them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from model.events import Event
from model.generation import GenerationConfig
from server.errors import TolkError
from server.metrics import SchedulerStats


@dataclass(frozen=True)
class Target:
    """What a batcher serves: the model directory, loaded on `device` in `dtype` (int8: with `int8`'s arithmetic)."""

    name: str
    directory: Path
    device: str
    dtype: str
    int8: str = "auto"


# --- down: commands ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submit:
    """Decode these sentences of one request; tokens are sent only when `stream`.

    A long request comes in pieces (server/scheduler.py): the first Submit says how many sentences the request has
    in all (`total`), and each later one carries the next sentences, numbered from `first`.
    """

    request: int
    sources: list[list[int]]
    configs: list[GenerationConfig]
    stream: bool
    deadline: float  # time.monotonic() after which the request fails with a 504 (one clock: same host)
    timeout: float  # the seconds that deadline allowed, for the error's message
    # per sentence, what its output must contain (a glossary's terms): each term a list of alternative target-token
    # sequences (model.constraints); None: no sentence has any
    constraints: list[list[list[list[int]]]] | None = None
    # per sentence, the source positions each of its terms translates (None where not known): where to start them
    constraint_sources: list[list[list[int]] | None] | None = None
    first: int = 0  # the request's number of this Submit's first sentence (0: the request's first Submit)
    total: int | None = None  # sentences the request has in all, over its Submits (None: these)

    @property
    def count(self) -> int:
        """Sentences the request has in all."""
        return self.total if self.total is not None else len(self.sources)

    def piece(self, start: int, stop: int) -> Submit:
        """Sentences `start` to `stop` (excluded) of this request, as one of its Submits."""
        cut = slice(start, stop)
        return replace(self, sources=self.sources[cut], configs=self.configs[cut],
                       constraints=self.constraints[cut] if self.constraints is not None else None,
                       constraint_sources=self.constraint_sources[cut] if self.constraint_sources is not None
                       else None, first=start, total=len(self.sources))

    def extend(self, more: Submit) -> Submit:
        """This request with the next sentences of `more` after its own."""
        n, m = len(self.sources), len(more.sources)
        constraints = constraint_sources = None
        if self.constraints is not None or more.constraints is not None:
            constraints = (self.constraints or [[] for _ in range(n)]) + (more.constraints or [[] for _ in range(m)])
            constraint_sources = ((self.constraint_sources or [None] * n)
                                  + (more.constraint_sources or [None] * m))
        return replace(self, sources=self.sources + more.sources, configs=self.configs + more.configs,
                       constraints=constraints, constraint_sources=constraint_sources)


@dataclass(frozen=True)
class Cancel:
    """The client went away: free the request's rows and forget it."""

    request: int


@dataclass(frozen=True)
class Stop:
    """Fail what is held (503) and exit."""


Command = Submit | Cancel | Stop


# --- up --------------------------------------------------------------------------------------------------------


@dataclass
class Output:
    """What one turn of the batcher produced: events per request (or the error that ended it), how many sentences
    have left its queue so far (admitted or dropped), and the metrics it measured."""

    events: dict[int, list[Event | TolkError]] = field(default_factory=dict)
    left: int = 0
    stats: SchedulerStats = field(default_factory=SchedulerStats)


@dataclass(frozen=True)
class Ready:
    """The batcher has loaded its model and allocated its cache."""

    device: str
    parameters: int  # counted before int8 quantization
    cache_bytes: int


@dataclass(frozen=True)
class Exited:
    """The batcher ended without being asked to (its thread died, or its process exited)."""

    reason: str
