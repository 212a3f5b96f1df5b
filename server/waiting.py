"""The batcher's waiting sentences, taken from the waiting requests in turn.

A request's sentences keep their order, but requests take turns: each admission starts with the request that has
waited longest since it was last served, and a request just served goes to the back. So a short request that
arrives behind a long document is admitted at one of the next free rows instead of after every sentence of the
document (first come, first served by sentence made it wait 5.7 s behind an 800-cue subtitle file,
bench/document_load.py).

Taking turns is not enough when one request can fill every row: four texts with a beam of 8 took all 32, and a short
request then waited until one of them finished (3.5 s; 9.8 s with a glossary). So a request holds at most its share
of the rows (`share`), and the rows beyond it stay for others, who join at the next step. A request holding no rows
may always take its next sentence, whatever its beam.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Pending:
    """A sentence waiting for rows: its request, its index there, the rows it takes and its source tokens."""

    request: int
    sentence: int
    beam: int
    tokens: int


class Waiting:
    """Waiting sentences per request, in turn order (the request served least recently first); each request within
    `share` rows (None: no limit)."""

    def __init__(self, share: int | None = None) -> None:
        self.share = share
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

    def order(self, held: Mapping[int, int] | None = None) -> Iterator[Pending]:
        """The sentences in the order they would be admitted: one per request per round, in turn order. A request's
        sentences stop where its rows (`held` in the batch, and those before in this order) would pass its share."""
        rows = dict(held or {})
        queues = list(self._queues.values())
        depth = 0
        while queues:
            more = []
            for q in queues:
                p = q[depth]
                have = rows.get(p.request, 0)
                if self.share is not None and have and have + p.beam > self.share:
                    continue  # at its share: this sentence and the request's later ones wait
                rows[p.request] = have + p.beam
                yield p
                if len(q) > depth + 1:
                    more.append(q)
            depth += 1
            queues = more

    def take(self, count: int, held: Mapping[int, int] | None = None) -> list[Pending]:
        """Remove the first `count` sentences of `order(held)`; the requests served go to the back, in that
        order."""
        items: list[Pending] = []
        for p in self.order(held):
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
