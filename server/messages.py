"""What passes between a model's `Scheduler` (the event loop's side) and its `Batcher` (the side that decodes).

The two may live in one process (a thread) or in two (a pipe between them); either way these typed records are
all that passes. Commands go down, `Output` and the lifecycle messages come up. The model's events
(`model.events`) travel inside `Output` as the decode batch made them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    """Decode these sentences of one request; tokens are sent only when `stream`."""

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
