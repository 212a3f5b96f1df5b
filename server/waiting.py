"""The batcher's waiting sentences, taken from the waiting requests in turn.

A request's sentences keep their order, but requests take turns: each admission starts with the request that has
waited longest since it was last served, and a request just served goes to the back. So a short request that
arrives behind a long document is admitted at one of the next free rows instead of after every sentence of the
document (first come, first served by sentence made it wait 5.7 s behind an 800-cue subtitle file,
bench/document_load.py).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Pending:
    """A sentence waiting for rows: its request, its index there, the rows it takes and its source tokens."""

    request: int
    sentence: int
    beam: int
    tokens: int


class Waiting:
    """Waiting sentences per request, in turn order (the request served least recently first)."""

    def __init__(self) -> None:
        self._queues: OrderedDict[int, deque[Pending]] = OrderedDict()

    def __bool__(self) -> bool:
        return bool(self._queues)

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def add(self, items: Iterable[Pending]) -> None:
        """Sentences of a new request (or more of a known one), after everything waiting."""
        for p in items:
            self._queues.setdefault(p.request, deque()).append(p)

    def push_front(self, items: list[Pending]) -> None:
        """Sentences that must go again first (an admission or a step ran out of memory), oldest first."""
        for p in reversed(items):
            self._queues.setdefault(p.request, deque()).appendleft(p)
            self._queues.move_to_end(p.request, last=False)

    def drop(self, request: int) -> None:
        self._queues.pop(request, None)

    def order(self) -> Iterator[Pending]:
        """The sentences in the order they would be admitted: one per request per round, in turn order."""
        queues = list(self._queues.values())
        depth = 0
        while queues:
            for q in queues:
                yield q[depth]
            depth += 1
            queues = [q for q in queues if len(q) > depth]

    def take(self, count: int) -> list[Pending]:
        """Remove the first `count` sentences of `order()`; the requests served go to the back, in that order."""
        items: list[Pending] = []
        for p in self.order():
            if len(items) == count:
                break
            items.append(p)
        for p in items:
            q = self._queues[p.request]
            q.popleft()
            if q:
                self._queues.move_to_end(p.request)
            else:
                del self._queues[p.request]
        return items
