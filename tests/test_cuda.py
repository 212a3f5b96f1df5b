"""The checks a GPU needs, run on every device there is: "cpu" always, "cuda" where torch sees one.

Half precision tracks float32, batching and the KV cache are invisible, the server answers on the device as the
engine does (batched, streamed, cancelled), and a genuine CUDA out-of-memory error inside the batcher loses nothing.
The CPU variants check the same things, so that the CUDA variants are known to be working tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from fastapi.testclient import TestClient

from model import checkpoint
from model.decode import DecodeBatch
from model.generation import GenerationConfig
from model.search import generate, greedy
from server.app import create_app
from server.scheduler import Scheduler
from tests.helpers import (
    LONG,
    batch_of,
    device_way_against_general_way,
    expected,
    finished_sentences,
    idle,
    inject,
    metric,
    metric_of,
    offline,
    run_job,
    scheduler_of,
    server_settings,
    slow_steps,
    stepped_logits,
    stream,
    thread_scheduler,
    translate,
    wait_for,
)
from tests.tiny import tiny_config, tiny_model

T = TypeVar("T")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="no CUDA device on this machine"))]
TEXTS = ["Open the file.", "Save changes before closing the settings window.", "Error while reading.",
         "Click here to continue.", "Disk full — 100% ação.", "Select all copy paste undo.",
         "The translation server could not open the language model.", "Não salvar."]
# Largest |logit - float32 logit| of the first decode step; the tiny model's logits span about ±10, so these are
# a few units in the last place of each format (measured on the CPU: 0.008 for float16, 0.08 for bfloat16).
HALF_ATOL = {"float16": 0.05, "bfloat16": 0.25}
MiB = 1 << 20


@pytest.fixture(scope="module", params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def loaded(device: str, tiny_model_dir: Path) -> checkpoint.LoadedModel:
    """The tiny model in float32 on the device."""
    return checkpoint.load(tiny_model_dir, device=device)


def first_step_logits(loaded: checkpoint.LoadedModel, texts: list[str]) -> torch.Tensor:
    """The logits (B, V) of the first decoder step, as the server's batch computes them (in float32)."""
    sources = [loaded.tokenizer.encode(t) for t in texts]
    batch = DecodeBatch(loaded.net, len(sources), max(map(len, sources)), 4)
    batch.admit([((0, i), src, loaded.generation) for i, src in enumerate(sources)])
    return batch.forward()[0]


# --- the engine ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_tracks_float32(device: str, dtype: str, tiny_model_dir: Path,
                                       loaded: checkpoint.LoadedModel) -> None:
    # float16 and bfloat16 both run on the CPU in torch 2.11 to 2.13 (matmul, SDPA, layer norm): nothing to skip
    half = checkpoint.load(tiny_model_dir, device=device, dtype=dtype)
    assert half.net.tgt_table.dtype == getattr(torch, dtype) and half.device.type == device
    exact, approx = first_step_logits(loaded, TEXTS), first_step_logits(half, TEXTS)
    torch.testing.assert_close(approx, exact, atol=HALF_ATOL[dtype], rtol=0)  # NaN or garbage fail here too
    sources = [loaded.tokenizer.encode(t) for t in TEXTS]
    ours, reference = greedy(half.net, sources, 24), greedy(loaded.net, sources, 24)
    # a rounding difference may flip a near tie and the rest of that sentence; a broken path changes them all
    assert sum(a == b for a, b in zip(ours, reference, strict=True)) >= len(TEXTS) // 2, (ours, reference)
    assert all(ours), "every sentence translates to something"


@pytest.mark.parametrize("beam_size", [1, 2])
def test_batched_equals_each_alone(loaded: checkpoint.LoadedModel, beam_size: int) -> None:
    sources = [loaded.tokenizer.encode(t) for t in TEXTS]
    assert len({len(s) for s in sources}) > 4  # lengths differ: padding and per-row positions are exercised
    config = GenerationConfig(max_new_tokens=20, beam_size=beam_size)
    alone = [generate(loaded.net, [s], config)[0][0] for s in sources]
    for max_rows in (64, 3):  # all rows at once; rows joining as others finish
        together = [h[0] for h in generate(loaded.net, sources, config, max_rows=max_rows)]
        assert [h.tokens for h in together] == [h.tokens for h in alone], max_rows
        for a, b in zip(together, alone, strict=True):
            assert a.score == pytest.approx(b.score, abs=1e-4)


def test_device_beam_step_gives_the_general_ways_hypotheses(loaded: checkpoint.LoadedModel,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Beam search chosen and moved on the device (the way every plain beam search takes off the CPU) against the
    general way, on the device itself."""
    device_way_against_general_way(loaded.net, [loaded.tokenizer.encode(t) for t in TEXTS], monkeypatch)


@pytest.mark.parametrize(("norm", "activation"), [("post", "relu"), ("pre", "gelu")])
def test_cached_decoding_equals_the_full_forward(device: str, norm: str, activation: str) -> None:
    model = tiny_model(tiny_config(norm=norm, activation=activation)).to(device)
    src = torch.tensor([[5, 6, 7, 8, 9, 2], [10, 11, 2, 0, 0, 0], [20, 2, 0, 0, 0, 0]], device=device)
    tgt = torch.randint(4, 90, (3, 7), generator=torch.Generator().manual_seed(0)).to(device)
    tgt[:, 0] = model.cfg.decoder_start_id
    with torch.no_grad():
        full = model(src, tgt)  # (3, 7, V): the modules over whole prefixes, no cache
    stepped = stepped_logits(model, src, tgt)  # the frozen network, one token a step through its KV cache
    assert stepped.device.type == device
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-4)


# --- the server ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(device: str, tiny_model_dir: Path) -> Iterator[TestClient]:
    """The app on the device in float32, its batcher a thread of this process so that tests can look inside."""
    settings = server_settings(tiny_model_dir, scheduler_process=False, max_batch_rows=16)
    with TestClient(create_app(settings.model_copy(update={"device": device}))) as c:
        yield c


@pytest.mark.parametrize("options", [{}, {"beam_size": 2}], ids=["greedy", "beam"])
def test_server_batch_equals_each_alone(client: TestClient, loaded: checkpoint.LoadedModel, device: str,
                                        options: dict[str, Any]) -> None:
    (card,) = client.get("/models").json()
    assert card["device"].split(":")[0] == device
    together = translate(client, TEXTS, options=options)["translatedText"]
    alone = [translate(client, t, options=options)["translatedText"] for t in TEXTS]
    assert together == alone == [offline(loaded, t, **options) for t in TEXTS]


@pytest.mark.parametrize("options", [{}, {"beam_size": 2}], ids=["greedy", "beam"])
def test_server_streamed_equals_not_streamed(client: TestClient, options: dict[str, Any]) -> None:
    texts = TEXTS[:4]
    expected_texts = translate(client, texts, options=options)["translatedText"]
    events = stream(client, texts, options=options)
    for index, text in enumerate(expected_texts):
        pieces = "".join(d["token"]["text"] for e, d in events if e == "token" and d["index"] == index)
        (done,) = [d for e, d in events if e == "done" and d["index"] == index]
        assert pieces == done["translatedText"] == text


def test_server_disconnect_frees_the_rows(client: TestClient, loaded: checkpoint.LoadedModel) -> None:
    scheduler = scheduler_of(client)
    batch, before = batch_of(scheduler), finished_sentences(client)
    with slow_steps(scheduler, 0.01):
        with client.stream("POST", "/translate/stream", json=LONG) as r:
            for line in r.iter_lines():
                if line.startswith("event: token"):
                    break  # leave while the 40 tokens decode
        wait_for(lambda: idle(scheduler))
        time.sleep(0.5)  # longer than the 40 steps would take: had it not been cancelled, it would have finished
    assert finished_sentences(client) == before
    assert metric(client, 'tolk_kv_cache_rows_used{model="tiny-en-pt"}') == 0
    assert batch_of(scheduler) is batch  # the rows were cancelled, not dropped with a batch that failed a step
    assert translate(client, TEXTS[:2])["translatedText"] == [offline(loaded, t) for t in TEXTS[:2]]


# --- out of memory on a real device ---------------------------------------------------------------------------------
# The tiny model's own steps need kilobytes, far below anything a memory limit can pin down on an 80 GB card. So
# a step (or an admission) also takes a working buffer that grows with its rows (or source tokens), as a large
# model's activations do, from the real caching allocator, under a real per-process limit: the OutOfMemoryError
# is the allocator's own, and it travels the batcher's real path (halving, empty_cache, requeueing).
# The limit is what the process holds after empty_cache plus `units` buffers and half a buffer of slack: a
# buffer is 64 MiB (a multiple of the allocator's 2 MiB rounding), so whether `n` units fit does not depend on the
# few 2 MiB segments of small blocks the steps create meanwhile, and the allocator, before it gives up, frees its
# cached blocks, so memory freed earlier never counts against the limit.
UNIT = 64 * MiB


@pytest.fixture
def cuda_scheduler(device: str, tiny_model_dir: Path) -> Iterator[tuple[Scheduler, checkpoint.LoadedModel]]:
    if device != "cuda":
        pytest.skip("needs a CUDA device")
    on_gpu = checkpoint.load(tiny_model_dir, device="cuda")
    scheduler = thread_scheduler(on_gpu, server_settings(tiny_model_dir, max_batch_rows=8))
    scheduler.start()
    yield scheduler, on_gpu
    scheduler.stop()


@contextmanager
def memory_limit(units: int) -> Iterator[None]:
    """Limit this process's CUDA allocator to what it holds now plus `units` buffers (and half a buffer)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + units * UNIT + UNIT // 2) / total)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


def takes_memory(units: Callable[..., int]) -> Callable[..., bool]:
    """A hook for tests.test_faults.inject that allocates units(batch, *args) buffers on the device and frees them;
    it never fails by itself: only the allocator can (a genuine torch.OutOfMemoryError)."""

    def hook(batch: DecodeBatch, *args: Any) -> bool:
        buffer = torch.empty(units(batch, *args) * UNIT, dtype=torch.uint8, device=batch.net.device)
        del buffer
        return False

    return hook


def within(seconds: float, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args), failing the test if it has not returned after `seconds` (a hang) instead of hanging with it."""
    future: Future[T] = Future()

    def target() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=target, daemon=True).start()
    return future.result(timeout=seconds)


def ooms() -> int:
    """Out-of-memory errors the CUDA caching allocator has raised in this process."""
    return int(torch.cuda.memory_stats().get("num_ooms", 0))


def test_real_out_of_memory_in_a_step_halves_the_rows_and_loses_nothing(
        cuda_scheduler: tuple[Scheduler, checkpoint.LoadedModel]) -> None:
    scheduler, on_gpu = cuda_scheduler
    batch = batch_of(scheduler)
    assert batch is not None
    configs = [on_gpu.generation] * 5 + [on_gpu.generation.update(beam_size=2)]
    texts = TEXTS[:6]
    wanted = [expected(on_gpu, c, t) for c, t in zip(configs, texts, strict=True)]  # without memory pressure
    before = ooms()
    # one buffer a row from the fourth step on: tokens have been streamed when the rows are halved
    steps = inject(batch, "forward", takes_memory(lambda b: b.n if len(steps) > 3 else 0))
    with memory_limit(units=3):
        streamed, finished = within(60, run_job, scheduler, [on_gpu.tokenizer.encode(t) for t in texts], configs)
    assert ooms() > before, "the allocator never ran out: the limit did not bite"
    assert metric_of(scheduler, "out_of_memory") >= 1
    assert steps[:4] == [7, 7, 7, 7] and max(steps[4:]) <= 3  # 7 rows ran out; then the row limit held
    assert [finished[i].hypotheses[0].tokens for i in range(len(texts))] == wanted
    assert all(streamed[i] == wanted[i] for i in range(5))  # nothing lost or sent twice (beams stream no tokens)
    wait_for(lambda: batch.n == 0)
    assert scheduler.running and scheduler.queued == 0


def test_real_out_of_memory_in_admission_halves_then_fails_alone(
        cuda_scheduler: tuple[Scheduler, checkpoint.LoadedModel]) -> None:
    scheduler, on_gpu = cuda_scheduler
    batch = batch_of(scheduler)
    assert batch is not None
    config = on_gpu.generation
    short = [on_gpu.tokenizer.encode(t) for t in TEXTS[:6]]
    long_ = on_gpu.tokenizer.encode(" ".join(TEXTS))
    budget = max(sum(map(len, short[:3])), sum(map(len, short[3:])))  # source tokens either half of the six
    assert len(long_) > budget and sum(map(len, short)) > budget
    wanted = [expected(on_gpu, config, t) for t in TEXTS[:6]]
    before = ooms()
    admissions = inject(batch, "admit", takes_memory(lambda b, items: sum(len(src) for _, src, _ in items)))
    with memory_limit(units=budget):  # one buffer a source token
        _, finished = within(60, run_job, scheduler, short, [config] * 6)
        assert admissions[:2] == [6, 3]  # six ran out; half of them fit
        assert [finished[i].hypotheses[0].tokens for i in range(6)] == wanted
        with pytest.raises(Exception, match="out of memory"):  # fits in no admission: fails alone, clearly
            within(60, run_job, scheduler, [long_], [config])
        streamed, finished = within(60, run_job, scheduler, [short[0]], [config])
    assert ooms() >= before + 2, "the allocator never ran out: the limit did not bite"
    assert streamed[0] == finished[0].hypotheses[0].tokens == wanted[0]
    assert scheduler.running and scheduler.queued == 0
