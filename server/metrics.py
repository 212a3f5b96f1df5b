"""Prometheus collectors, defined once. Each app gets its own registry, so several apps never clash.

Labels are low-cardinality only: model, route, status, reason, error_type.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
STEP = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Metrics:
    """All of the server's collectors on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.requests = Counter("tolk_requests", "HTTP requests answered", ["route", "status"], registry=r)
        self.failures = Counter("tolk_request_failures", "Requests that ended in an error", ["error_type"],
                                registry=r)
        self.input_tokens = Counter("tolk_input_tokens", "Source tokens admitted", ["model"], registry=r)
        self.generated_tokens = Counter("tolk_generated_tokens", "Tokens generated (best hypothesis)",
                                        ["model", "reason"], registry=r)
        self.running = Gauge("tolk_requests_running", "Requests with sentences decoding", ["model"], registry=r)
        self.waiting = Gauge("tolk_requests_waiting", "Requests waiting for cache rows", ["model"], registry=r)
        self.rows_used = Gauge("tolk_kv_cache_rows_used", "KV cache rows in use", ["model"], registry=r)
        self.cache_bytes = Gauge("tolk_kv_cache_bytes", "Bytes held by the KV cache", ["model"], registry=r)
        self.duration = Histogram("tolk_request_duration_seconds", "Time to answer a request", ["route"],
                                  buckets=LATENCY, registry=r)
        self.queue = Histogram("tolk_queue_duration_seconds", "Time from submission to first admission",
                               ["model"], buckets=LATENCY, registry=r)
        self.ttft = Histogram("tolk_time_to_first_token_seconds", "Time from submission to the first token",
                              ["model"], buckets=LATENCY, registry=r)
        self.itl = Histogram("tolk_inter_token_latency_seconds", "Time between tokens of one sentence", ["model"],
                             buckets=STEP, registry=r)
        self.batch_rows = Histogram("tolk_batch_rows", "Rows in one decode step", ["model"], buckets=ROWS,
                                    registry=r)
        self.out_of_memory = Counter("tolk_out_of_memory", "Out-of-memory errors survived by halving the batch",
                                     ["model"], registry=r)
        self.row_limit = Gauge("tolk_batch_rows_limit", "Rows the scheduler lets decode together now (lowered "
                               "after an out-of-memory error)", ["model"], registry=r)
        self.restarts = Counter("tolk_scheduler_restarts", "Scheduler threads restarted after they died", ["model"],
                                registry=r)
        self.translation_cache = Counter("tolk_translation_cache", "Sentences looked up in the translation cache "
                                         "(sampled ones are not)", ["model", "result"], registry=r)
        self.step = Histogram("tolk_decode_step_seconds", "Time of one decode step", ["model"], buckets=STEP,
                              registry=r)
        self.model_loads = Histogram("tolk_model_load_seconds", "Loads of a model on demand (TOLK_MAX_LOADED_MODELS) "
                                     "and the time requests waited for each", ["model"], buckets=LATENCY, registry=r)
        self.model_unloads = Counter("tolk_model_unloads", "Models unloaded to make room or after idling", ["model"],
                                     registry=r)


@dataclass
class SchedulerStats:
    """What a model's batcher measured since its last report: one typed record, applied where the collectors live.

    The batcher may run in another process; it fills one of these and sends it up with each step's events. Gauges
    carry their latest value (None: unchanged), counters what to add, histograms the observations.
    """

    running: int | None = None  # requests with sentences decoding
    waiting: int | None = None  # requests none of whose sentences is decoding yet
    rows_used: int | None = None
    cache_bytes: int | None = None
    row_limit: int | None = None
    input_tokens: int = 0
    out_of_memory: int = 0
    generated: dict[str, int] = field(default_factory=dict)  # finish reason -> tokens of best hypotheses
    queue: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    batch_rows: list[int] = field(default_factory=list)
    step: list[float] = field(default_factory=list)

    def __bool__(self) -> bool:
        """Whether there is anything to apply (a gauge set to 0 is something)."""
        return self != SchedulerStats()

    def take(self) -> SchedulerStats:
        """This record's contents, leaving it empty."""
        taken = replace(self)
        self.__dict__.update(SchedulerStats().__dict__)
        return taken

    def apply(self, metrics: Metrics, model: str) -> None:
        """Add this record to the collectors of `model`."""
        for name in ("running", "waiting", "rows_used", "cache_bytes", "row_limit"):
            value = getattr(self, name)
            if value is not None:
                getattr(metrics, name).labels(model=model).set(value)
        if self.input_tokens:
            metrics.input_tokens.labels(model=model).inc(self.input_tokens)
        if self.out_of_memory:
            metrics.out_of_memory.labels(model=model).inc(self.out_of_memory)
        for reason, tokens in self.generated.items():
            metrics.generated_tokens.labels(model=model, reason=reason).inc(tokens)
        for name in ("queue", "ttft", "itl", "batch_rows", "step"):
            histogram = getattr(metrics, name).labels(model=model)
            for value in getattr(self, name):
                histogram.observe(value)


class MetricsMiddleware:
    """Counts every HTTP request by route template and status, and times it until its last byte is sent.

    A response the client left before its last byte (a stream reset mid-way) counts as 499, nginx's status for a
    request the client closed: its 200 went out with the headers, but the client never had the answer."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        left = ended = False  # the client went away; the response's last byte was sent

        async def watch(message: Message) -> None:
            nonlocal status, ended
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = True
            await send(message)

        async def listen() -> Message:
            nonlocal left
            message = await receive()
            left = left or message["type"] == "http.disconnect"
            return message

        try:
            await self.app(scope, listen, watch)
        finally:
            if left and not ended:
                status = 499
            route = scope.get("route")
            path = getattr(route, "path", "other")  # the template, never the raw path: bounded cardinality
            self.metrics.requests.labels(route=path, status=str(status)).inc()
            self.metrics.duration.labels(route=path).observe(time.perf_counter() - start)
