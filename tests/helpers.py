"""Helpers the test modules share: the test app and requests to it, the engine's own answers, files and
model directories to feed it. Fixtures live in conftest.py; the tiny model in tiny.py."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import io
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import docx
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
import sentencepiece as spm
import torch
from fastapi.testclient import TestClient
from torch import nn

from model import (  # noqa: E402
    calibrate,
    checkpoint,
)
from model.checkpoint import (
    LoadedModel,
    load,
    quantize_int8,  # noqa: E402
)
from model.ct2_import import permute_hidden
from model.decode import DecodeBatch
from model.events import FinishEvent, Hypothesis, TokenEvent
from model.frozen import FrozenTransformer, freeze
from model.generation import GenerationConfig
from model.layers import sinusoidal_table
from model.search import generate
from model.tokenizer import IncrementalDetokenizer, Tokenizer
from model.transformer import Transformer
from server import cli
from server import placeholders as ph
from server.app import create_app
from server.batcher import Batcher
from server.cli import main as tolk
from server.limits import source_limit
from server.messages import Target
from server.metrics import Metrics
from server.plan import Plan
from server.scheduler import Scheduler
from server.settings import Settings
from server.text import split_html
from server.transport import ThreadTransport
from tests.tiny import WORDS, corpus_lines, tiny_config, tiny_model

# The test app: its settings, and requests and answers through it


def parse_sse(body: str) -> list[tuple[str, Any]]:
    """(event, data) pairs of a text/event-stream body; checks the framing as it goes."""
    events = []
    for block in body.split("\n\n"):
        if not block.strip() or block.startswith(":"):
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        assert set(fields) == {"event", "data"}, block
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def tags(document: str) -> Counter[str]:
    return Counter(content for is_text, content in split_html(document) if not is_text)


# Every test app's data directory lies under this one, removed when the test run ends (before, each app left a
# directory in the system's temporary folder: some 150 a run).
_DATA_ROOT = tempfile.TemporaryDirectory(prefix="tolk-test-data-")


def server_settings(model_dir: Path, **changes: Any) -> Settings:
    """Settings for a test app: the tiny model on the CPU in float32 (its answers are compared with the engine's
    own), small limits, nothing read from the environment. The batcher is a thread of the test process: a child
    process costs seconds to start and stop, about 60 times a run. The tests where the child process matters (the
    HTTP contract, the transport, requests under load, glossaries, resets, fuzzed options, live servers) ask for
    it, as users run it, with `scheduler_process=True`. The translation cache is off, so that every request
    decodes (tests/test_cache.py turns it on)."""
    # glossaries (SQLite) go to a directory of the test run, never into the checkout's data/server
    data_dir = Path(tempfile.mkdtemp(prefix="app-", dir=_DATA_ROOT.name))
    settings: dict[str, Any] = {"translation_cache_entries": 0, "device": "cpu", "dtype": "float32",
                                "data_dir": data_dir, "scheduler_process": False, **changes}
    return Settings(_env_file=None, models=[model_dir],  # type: ignore[call-arg]
                    max_text_chars=2000, max_texts=8, max_body_bytes=64 * 1024, **settings)


def translate(client: TestClient, q: str | list[str], **fields: Any) -> Any:
    r = client.post("/translate", json={"q": q, "source": "en", "target": "pt", **fields})
    assert r.status_code == 200, r.text
    return r.json()


def stream(client: TestClient, q: str | list[str], **fields: Any) -> list[tuple[str, Any]]:
    r = client.post("/translate/stream", json={"q": q, "source": "en", "target": "pt", **fields})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-accel-buffering"] == "no"
    return parse_sse(r.text)


def metric(client: TestClient, line_start: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Inside the test app: its scheduler and batcher, slowed down or waited for; the engine's own answer


LONG = {"q": "Open the file.", "target": "pt", "options": {"min_new_tokens": 40, "max_new_tokens": 40}}


@contextmanager
def app_client(model_dir: Path, **settings: Any) -> Iterator[TestClient]:
    """A test app whose batcher is a thread of this process, so that the test can look inside it."""
    with TestClient(create_app(server_settings(model_dir, **settings))) as client:
        yield client


def scheduler_of(client: TestClient) -> Scheduler:
    scheduler: Scheduler = client.app.state.registry.models[0].scheduler  # type: ignore[attr-defined]
    return scheduler


def thread_scheduler(loaded: LoadedModel, settings: Settings, metrics: Metrics | None = None) -> Scheduler:
    """A scheduler (not started) whose batcher is a thread of this process, on an already loaded model."""
    return Scheduler(Target("tiny", loaded.path, "cpu", loaded.dtype), settings, metrics or Metrics(),
                     source_limit(settings, loaded.model.cfg.max_positions), ThreadTransport(loaded))


def batcher_of(scheduler: Scheduler) -> Batcher:
    transport = scheduler.transport
    assert isinstance(transport, ThreadTransport) and transport.batcher is not None
    return transport.batcher


def batch_of(scheduler: Scheduler) -> DecodeBatch | None:
    return batcher_of(scheduler).batch


def idle(scheduler: Scheduler) -> bool:
    batch = batch_of(scheduler)
    return batch is not None and batch.n == 0


@contextmanager
def slow_steps(scheduler: Scheduler, seconds: float) -> Iterator[None]:
    """Make each decode step last a little longer, so that a test can act while a request decodes."""
    batch = batch_of(scheduler)
    assert batch is not None
    original = batch.forward

    def forward(choose: bool = False) -> Any:
        time.sleep(seconds)
        return original(choose)

    batch.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        del batch.forward


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def finished_sentences(client: TestClient) -> float:
    """Sequences that ran to their end (cancelled ones never count here)."""
    return metric(client, 'tolk_generated_tokens_total{model="tiny-en-pt",reason="length"}')


def offline(loaded: LoadedModel, text: str, **options: Any) -> str:
    """The engine alone: model.search.generate on this one sentence."""
    (hyps,) = generate(loaded.net, [loaded.tokenizer.encode(text)], loaded.generation.update(**options))
    return loaded.tokenizer.decode(hyps[0].tokens)


REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("Open the file.", {}),
    ("Save changes before closing.", {"max_new_tokens": 7}),
    ("The file could not be opened.", {"beam_size": 3}),
    ("Disk full.", {"do_sample": True, "seed": 11, "top_k": 5}),
    ("Select all copy paste undo.", {"repetition_penalty": 1.5}),
    ("Click here to continue.", {"beam_size": 2, "length_penalty": 0.6}),
    ("Error while reading.", {"min_new_tokens": 10}),
    ("Translation server language model.", {"no_repeat_ngram_size": 2}),
] * 2


def assert_requests_under_load_equal_each_alone(model_dir: Path, dtype: str) -> None:
    """Concurrent requests through the server (its scheduler in a child process, as users run it) translate exactly
    as the engine translates each alone, in this precision."""
    loaded = load(model_dir, device="cpu", dtype=dtype)
    settings = server_settings(model_dir, dtype=dtype, max_batch_rows=16, scheduler_process=True)
    with TestClient(create_app(settings)) as c:
        def post(item: tuple[str, dict[str, Any]]) -> str:
            r = c.post("/translate", json={"q": item[0], "target": "pt", "options": item[1]})
            assert r.status_code == 200, r.text
            return str(r.json()["translatedText"])

        with ThreadPoolExecutor(len(REQUESTS)) as pool:
            together = list(pool.map(post, REQUESTS))
    assert together == [offline(loaded, text, **options) for text, options in REQUESTS]


# Requests with generation options, as the cache tests send them


HIT = 'tolk_translation_cache_total{model="tiny-en-pt",result="hit"}'


def translate_with(client: TestClient, q: str | list[str], **options: Any) -> dict[str, Any]:
    r = client.post("/translate", json={"q": q, "source": "en", "target": "pt", "options": options})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def stream_with(client: TestClient, q: str, **options: Any) -> list[tuple[str, Any]]:
    r = client.post("/translate/stream", json={"q": q, "source": "en", "target": "pt", "options": options})
    assert r.status_code == 200, r.text
    return parse_sse(r.text)


# A scheduler driven directly, and faults injected into its batch


TEXTS = ["Open the file.", "Save changes before closing.", "The file could not be opened.", "Disk full.",
         "Select all copy paste undo.", "Click here to continue."]


OPTIONS: list[dict[str, Any]] = [{}, {"max_new_tokens": 7}, {"beam_size": 2}, {"do_sample": True, "seed": 11},
                                 {"do_sample": True, "top_k": 5}, {"repetition_penalty": 1.5}]


def run_job(scheduler: Scheduler, sources: list[list[int]], configs: list[GenerationConfig]) -> tuple[
        dict[int, list[int]], dict[int, FinishEvent]]:
    """Submit one streaming job; the token ids streamed per sentence and each sentence's FinishEvent."""

    async def scenario() -> tuple[dict[int, list[int]], dict[int, FinishEvent]]:
        job = scheduler.submit(sources, configs, stream=True)
        streamed: dict[int, list[int]] = {i: [] for i in range(len(sources))}
        finished: dict[int, FinishEvent] = {}
        async for event in job.events():
            if isinstance(event, TokenEvent):
                streamed[event.sentence].append(event.token)
            else:
                finished[event.sentence] = event
        return streamed, finished

    return asyncio.run(scenario())


def inject(batch: DecodeBatch, name: str, fails: Any) -> list[int]:
    """Make batch.<name> raise an out-of-memory error whenever fails(batch, args) says so; returns the sizes seen."""
    original = getattr(batch, name)
    seen: list[int] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        seen.append(batch.n if name == "forward" else len(args[0]))
        if fails(batch, *args):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return original(*args, **kwargs)

    setattr(batch, name, wrapper)
    return seen


def expected(loaded: LoadedModel, config: GenerationConfig, text: str) -> list[int]:
    (hyps,) = generate(loaded.net, [loaded.tokenizer.encode(text)], config)
    return hyps[0].tokens


def metric_of(scheduler: Scheduler, name: str) -> float:
    collector = getattr(scheduler._metrics, name).labels(model=scheduler.name)
    return float(collector._value.get())


# The network stepped one token at a time; the beam search's device way against its general way


def stepped_logits(model: Transformer, src: torch.Tensor, tgt: torch.Tensor, prepack: bool = True,
                   fused: bool = True) -> torch.Tensor:
    """Logits (B, T, V) of the frozen network fed tgt one token per step through its KV cache."""
    with torch.no_grad():
        net = freeze(model, prepack=prepack, fused=fused)
        cache = net.new_cache(rows=src.shape[0], max_src=src.shape[1], max_tgt=tgt.shape[1] + 2)
        memory, mask = net.encode(src)
        cache.admit(0, net.cross_kv(memory), mask)
        return torch.stack([net.decode_step(tgt[:, t], cache) for t in range(tgt.shape[1])], 1)


def device_way_against_general_way(net: FrozenTransformer, sources: list[list[int]],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`device_beam_step` (the choice, moves and record as tensors, one transfer up) against the general way: the
    same hypotheses, scores and finish reasons bit for bit, with rows reused as sentences finish, end of sentence
    held back, sentences running out of length, and a greedy row beside the beams (the general way then)."""
    import model.beams
    import model.search
    taken: list[bool] = []
    device_beam_step = model.beams.device_beam_step

    def counted(batch: DecodeBatch, seqs: list) -> bool:
        went = device_beam_step(batch, seqs)
        taken.append(went)
        return went

    configs = [GenerationConfig(beam_size=3, num_hypotheses=3, max_new_tokens=16),
               GenerationConfig(beam_size=4, num_hypotheses=2, max_new_tokens=6, length_penalty=0.6,
                                min_new_tokens=3),
               [GenerationConfig(beam_size=2, max_new_tokens=12)] * (len(sources) - 1)
               + [GenerationConfig(max_new_tokens=3)]]
    ended = 0
    for config in configs:
        monkeypatch.setattr(model.beams, "DEVICE_WAY_ON_CPU", True)
        monkeypatch.setattr(model.beams, "device_beam_step", counted)
        taken.clear()
        device_way = generate(net, sources, config, max_rows=2 * 4)
        assert taken and all(taken)
        monkeypatch.setattr(model.search, "short_beam_step", lambda batch, seqs: False)
        general = generate(net, sources, config, max_rows=2 * 4)
        monkeypatch.undo()
        assert [[(h.tokens, h.score, h.finish_reason) for h in hyps] for hyps in device_way] == \
            [[(h.tokens, h.score, h.finish_reason) for h in hyps] for hyps in general]
        ended += sum(h.finish_reason == "eos" for hyps in general for h in hyps)
    assert ended, "some hypotheses should end with end of sentence"


# The fused CPU step against the operator step


SOURCE_IDS = [[5, 9, 14, 22, 7, 2], [30, 2], [11, 12, 13, 14, 15, 16, 17, 18, 19, 2], [40, 41, 42, 2], [8, 60, 2]]


def nets(dtype: str, **changes: object) -> tuple[FrozenTransformer, FrozenTransformer]:
    """The same tiny model frozen with and without the fused step; int8 with input ranges measured on SOURCE_IDS."""
    model = tiny_model(tiny_config(**changes))
    if dtype == "int8":
        ranges = calibrate.measure(freeze(model, fused=False), SOURCE_IDS, GenerationConfig(max_new_tokens=12))
        model = quantize_int8(model)
    fused, plain = freeze(model), freeze(model, fused=False)
    if dtype == "int8":
        calibrate.apply(fused, ranges)
        calibrate.apply(plain, ranges)
    assert fused.fused is not None and fused.fused.ready() and plain.fused is None
    return fused, plain


def released_decodes_as_kept(net: FrozenTransformer, plain: FrozenTransformer,
                             configs: tuple[GenerationConfig, ...]) -> None:
    """A network whose operator weights were released (`release_operator_decoder`, `release_operator_encoder`)
    gives the tokens of one that kept them, and refuses calibration, which observes the operator products, with a
    clear error instead of reading weights that are gone."""
    for config in configs:
        with torch.inference_mode():
            a, b = generate(net, SOURCE_IDS, config, max_rows=12), generate(plain, SOURCE_IDS, config, max_rows=12)
        assert [h[0].tokens for h in a] == [h[0].tokens for h in b]
    for p in net.projections().values():
        p.observed = torch.full((2,), math.inf)
    net.products_changed()
    with pytest.raises(RuntimeError, match="released"), torch.inference_mode():
        generate(net, SOURCE_IDS[:1], configs[0])


# Dynamic int8


# Sentences of very different lengths and words, so that batch-wide activation scales would differ from each one's own
MIXED = ["Open the file.", "Save changes before closing the settings window, then click here to continue.", "Error",
         "Disk full.", "ação não configurações arquivo salvar translation server language model."]


def quantized(linear: nn.Linear) -> Any:
    return torch.ao.quantization.quantize_dynamic(nn.Sequential(linear), {nn.Linear}, dtype=torch.qint8)[0]


# Documents to translate, and the file routes


URL = re.compile(r"http://testserver/download_file/[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}\.(.+)")


def upload(client: TestClient, name: str, data: bytes, **fields: str) -> dict[str, Any]:
    r = client.post("/translate_file", files={"file": (name, data)}, data={"source": "en", "target": "pt", **fields})
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def translate_file(client: TestClient, name: str, data: bytes, media_type: str) -> bytes:
    """Upload, check the answer's URL (LibreTranslate's shape) and the download's headers; the translated bytes."""
    url = upload(client, name, data)["translatedFileUrl"]
    m = URL.fullmatch(url)
    assert m, url
    stem, ext = name.rsplit(".", 1)
    assert m.group(1) == f"{stem}_pt.{ext}"
    r = client.get(url)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == media_type
    assert r.headers["content-disposition"] == f'attachment; filename="{stem}_pt.{ext}"'
    return r.content


def make_docx() -> bytes:
    doc = docx.Document()
    doc.add_heading("Open the file.", level=1)
    p = doc.add_paragraph("Save changes ")
    p.add_run("before closing").bold = True
    p.add_run(" the window").italic = True
    p.add_run(".")
    split = doc.add_paragraph()  # two runs of one formatting: one span, translated as one text
    split.add_run("Click here ")
    split.add_run("to continue.")
    doc.add_paragraph().add_run("Disk full:\tselect all")  # a tab between two texts stays between them
    table = doc.add_table(rows=2, cols=2)
    for i, cell in enumerate(table._cells):
        cell.text = ["Error while reading.", "Copy.", "Paste.", "Undo."][i]
    doc.sections[0].header.paragraphs[0].text = "Translation server."
    out = io.BytesIO()
    doc.save(out)
    return out.getvalue()


CHAPTER = ('<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html>\n<html xmlns="http://www.w3.org/1999/xhtml">'
           '<head><title>Open the file.</title></head>\n<body><h1>Save changes.</h1><p>Click <em>here</em> to '
           'continue.<br/>Select all.</p></body></html>\n')


def make_epub(chapter: str = CHAPTER) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        z.writestr("META-INF/container.xml", '<?xml version="1.0"?><container version="1.0" '
                   'xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles><rootfile '
                   'full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/></rootfiles></container>')
        z.writestr("OEBPS/content.opf", '<?xml version="1.0" encoding="utf-8"?><package version="3.0" '
                   'xmlns="http://www.idpf.org/2007/opf"><metadata xmlns:dc="http://purl.org/dc/elements/1.1/">'
                   '<dc:title>Translation server</dc:title><dc:language>en</dc:language><dc:identifier id="id">'
                   'urn:uuid:1</dc:identifier></metadata><manifest><item id="c1" href="ch1.xhtml" '
                   'media-type="application/xhtml+xml"/></manifest><spine><itemref idref="c1"/></spine></package>')
        z.writestr("OEBPS/toc.ncx", '<?xml version="1.0" encoding="utf-8"?><ncx xmlns="http://www.daisy.org/z3986/'
                   '2005/ncx/" version="2005-1"><navMap><navPoint id="n1"><navLabel><text>Open settings</text>'
                   '</navLabel><content src="ch1.xhtml"/></navPoint></navMap></ncx>')
        z.writestr("OEBPS/ch1.xhtml", chapter)
        z.writestr("OEBPS/cover.png", b"\x89PNG\r\n\x1a\n\x00\x00binary")
    return out.getvalue()


# Hostile files: bombs, damaged and encrypted documents


W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'


PARAGRAPH = f'<w:document {W}><w:body><w:p><w:r><w:t>Open the file.</w:t></w:r></w:p></w:body></w:document>'


LAUGHS = ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
          + "".join(f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10 if i > 1 else "&lol;" * 10}">' for i in range(1, 10))
          + f']><w:document {W}><w:body><w:p><w:r><w:t>&lol9;</w:t></w:r></w:p></w:body></w:document>')


def zipped(entries: dict[str, bytes | str]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return out.getvalue()


def word(document: str, **more: bytes | str) -> bytes:
    """A minimal .docx: its content types and its document part (and more entries)."""
    return zipped({"[Content_Types].xml": "<Types/>", "word/document.xml": document, **more})


def patched(data: bytes, local: int, central: int, value: bytes) -> bytes:
    """The archive with `value` written at one offset of every local header and one of every central record."""
    out = bytearray(data)
    for signature, offset in ((b"PK\x03\x04", local), (b"PK\x01\x02", central)):
        at = out.find(signature)
        while at >= 0:
            out[at + offset:at + offset + len(value)] = value
            at = out.find(signature, at + 4)
    return bytes(out)


def understated(data: bytes, size: int) -> bytes:
    """The archive with every entry's declared size set to `size`."""
    return patched(data, 22, 24, size.to_bytes(4, "little"))


def encrypted(data: bytes) -> bytes:
    """The archive with every entry marked as encrypted (bit 0 of its flags)."""
    return patched(data, 6, 8, b"\x01\x00")


def duplicated(data: bytes) -> bytes:
    """The archive with a second word/document.xml (a reader could take either)."""
    out = io.BytesIO(data)
    with warnings.catch_warnings(), zipfile.ZipFile(out, "a") as z:
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name: that is the point
        z.writestr("word/document.xml", PARAGRAPH.replace("Open", "Close"))
    return out.getvalue()


def damaged(data: bytes) -> bytes:
    """The archive with the start of its document part's compressed bytes overwritten (its directory intact)."""
    at = data.find(b"word/document.xml") + len("word/document.xml")
    return data[:at] + b"\xff" * 20 + data[at + 20:]


def hostile_files(secret: Path) -> dict[str, tuple[str, bytes, int, str]]:
    """case -> (file name, bytes, expected status, expected error_type), for a server with small file limits."""
    xxe = (f'<?xml version="1.0"?><!DOCTYPE w:document [<!ENTITY s SYSTEM "file://{secret}">]><w:document {W}>'
           '<w:body><w:p><w:r><w:t>&s;</w:t></w:r></w:p></w:body></w:document>')
    nested = f'<w:document {W}><w:body>{"<w:sdt>" * 5000}{"</w:sdt>" * 5000}</w:body></w:document>'
    bomb = word(PARAGRAPH, **{"word/media/zeros.bin": b"\0" * (2 << 20)})
    epub = zipped({"mimetype": "application/epub+zip", "META-INF/container.xml": "<container/>"})
    odt = zipped({"mimetype": "application/vnd.oasis.opendocument.text", "content.xml": LAUGHS})
    return {
        "zip bomb": ("bomb.docx", bomb, 413, "payload_too_large"),
        "sizes that lie": ("lying.docx", understated(bomb, 100), 400, "invalid_document"),
        "too many entries": ("many.docx", word(PARAGRAPH, **{f"e{i}": "" for i in range(60)}), 413,
                             "payload_too_large"),
        "external entity": ("xxe.docx", word(xxe), 400, "invalid_document"),
        "billion laughs": ("laughs.docx", word(LAUGHS), 400, "invalid_document"),
        "billion laughs in odt": ("laughs.odt", odt, 400, "invalid_document"),
        "deep nesting": ("deep.docx", word(nested), 400, "invalid_document"),
        "entry leaves its folder": ("escape.docx", word(PARAGRAPH, **{"../../evil.sh": "x"}), 400,
                                    "invalid_document"),
        "absolute entry": ("absolute.docx", word(PARAGRAPH, **{"/etc/evil": "x"}), 400, "invalid_document"),
        "drive letter entry": ("drive.docx", word(PARAGRAPH, **{"C:/evil": "x"}), 400, "invalid_document"),
        "backslash entry": ("backslash.docx", word(PARAGRAPH, **{"..\\evil": "x"}), 400, "invalid_document"),
        "duplicate entry": ("twice.docx", duplicated(word(PARAGRAPH)), 400, "invalid_document"),
        "encrypted entries": ("locked.docx", encrypted(word(PARAGRAPH)), 400, "invalid_document"),
        "not a zip": ("text.docx", b"Open the file.", 400, "invalid_document"),
        "another zip": ("book.docx", epub, 400, "invalid_document"),
        "not xml": ("broken.docx", word("<w:document><w:body>"), 400, "invalid_document"),
        "truncated": ("cut.docx", word(PARAGRAPH)[:-30], 400, "invalid_document"),
        "damaged entry": ("damaged.docx", damaged(word(PARAGRAPH * 50)), 400, "invalid_document"),
        "binary text": ("program.txt", b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0", 400, "invalid_document"),
        "not utf-8": ("latin.txt", "café crème".encode("latin-1"), 400, "invalid_encoding"),
        "oversized upload": ("big.txt", b"Open the file. " * 5000, 413, "payload_too_large"),
        "too much text": ("long.txt", b"Open the file. " * 100, 413, "payload_too_large"),
    }


# Placeholders


def counts(text: str, source: str) -> dict[str, tuple[int, int]]:
    """Each placeholder text of source: (times in source, times in text)."""
    return {p.text: (source.count(p.text), text.count(p.text)) for p in ph.find(source)}


def kept(source: str, out: str) -> bool:
    return all(a == b for a, b in counts(out, source).values())


# Model directories relabelled as other language pairs


def relabelled(model_dir: Path, directory: Path, source: str, target: str) -> Path:
    """A copy of the tiny model, under directory, that says it translates source -> target (its weights do not
    care)."""
    out = directory / f"tiny-{source}-{target}"
    shutil.copytree(model_dir, out)
    info = json.loads((out / "info.json").read_text())
    info.update(name=f"tiny-{source}-{target}", source_language=source, target_language=target)
    (out / "info.json").write_text(json.dumps(info))
    return out


# Language detection


ES = "No se pudo abrir el archivo porque el disco está lleno."


def renamed(model_dir: Path, out: Path, source: str, target: str, generation: dict[str, Any] | None = None) -> Path:
    """A copy of a model directory that says it translates source -> target."""
    shutil.copytree(model_dir, out)
    info = {"name": f"tiny-{source}-{target}", "source_language": source, "target_language": target}
    (out / "info.json").write_text(json.dumps(info))
    if generation is not None:
        (out / "generation.json").write_text(json.dumps(generation))
    return out


# Fuzzing: a character tokenizer that copies its input


class CharTokenizer:
    """One token per character (its code point): decoding is exact, so a plan can be joined back by hand."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], unknowns: Mapping[int, str] | None = None) -> str:
        """(No id is an unknown token here, so `unknowns` changes nothing.)"""
        return "".join(map(chr, ids))

    def detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(cast(Tokenizer, self))

    def writes(self, char: str) -> bool:
        return True

    def source_words(self, ids: list[int]) -> list[int]:
        """A word starts at each space, as at each SentencePiece piece that starts with U+2581."""
        out, word = [], -1
        for i in ids:
            word += chr(i).isspace() or word < 0
            out.append(word)
        return out


CHARS = cast(Tokenizer, CharTokenizer())


def identity(plan: Plan) -> dict[int, Hypothesis]:
    """Each sentence 'translated' into itself, each character aligned with itself."""
    return {s: Hypothesis(ids, 0.0, "eos", list(range(len(ids)))) for s, ids in enumerate(plan.sources)}


# CTranslate2 models made from the tiny model, and both engines' translations


MAX_LEN = 40


def bench_converter() -> Any:
    """bench/ct2_convert.py's TolkConverter (bench/ is scripts, not a package)."""
    path = Path(__file__).resolve().parent.parent / "bench" / "ct2_convert.py"
    spec = importlib.util.spec_from_file_location("ct2_convert", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("ct2_convert", module)
    spec.loader.exec_module(module)
    return module


def with_config(model_dir: Path, out: Path, **changes: Any) -> Path:
    """A copy of a model directory with config fields changed (or its weights permuted: `perm`)."""
    shutil.copytree(model_dir, out)
    perm = changes.pop("perm", None)
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, **changes}))
    if perm is not None:
        loaded = checkpoint.load(out, device="cpu")
        loaded.model.load_state_dict(permute_hidden(loaded.model.state_dict(), perm))
        checkpoint.save(out, loaded.model, loaded.info, out / "source.spm", out / "target.spm")
    return out


def to_ct2(model_dir: Path, out: Path, quantization: str | None = None, interleave: list[int] | None = None,
           onmt_vocab: str = "") -> Path:
    """Convert with CTranslate2's spec classes and serializer; the source flags as the Tolk model has them, the
    position table interleaved (OpenNMT-py's layout) when `interleave` gives the inverse permutation, and the
    vocabulary numbered as OpenNMT-py numbers it on the sides onmt_vocab names ("source", "target" or both)."""
    module = bench_converter()
    cfg = checkpoint.read_meta(model_dir).cfg

    class Converter(module.TolkConverter):  # type: ignore[misc, name-defined]
        def _load(self) -> Any:
            spec = super()._load()
            spec.config.add_source_eos = cfg.add_source_eos
            spec.config.add_source_bos = cfg.add_source_bos
            if interleave is not None:
                table = sinusoidal_table(cfg.max_positions, cfg.d_model)[:, interleave]
                spec.encoder.position_encodings.encodings = table
                spec.decoder.position_encodings.encodings = table
            if onmt_vocab:
                renumber_like_onmt(spec, onmt_vocab)
            return spec

    Converter(model_dir).convert(str(out), quantization=quantization, force=True)
    shutil.copyfile(model_dir / "source.spm", out / "sentencepiece.model")
    return out


def renumber_like_onmt(spec: Any, sides: str) -> None:
    """The spec's vocabulary (SentencePiece's pad 0, bos 1, eos 2, unk 3) renumbered as OpenNMT-py's on `sides`;
    the source alone gets eos and unk swapped (a source numbered otherwise, its pad where the target's is)."""
    pieces = spec._vocabularies["target"][0]
    order = [3, 0, 1, 2] if "target" in sides else [0, 1, 3, 2]
    index = torch.tensor([*order, *range(4, len(pieces))])
    names = ["<unk>", "<blank>", "<s>", "</s>", *pieces[4:]] if "target" in sides else [pieces[i] for i in index]
    layers = {"source": [spec.encoder.embeddings[0]], "target": [spec.decoder.embeddings, spec.decoder.projection]}
    for side in ("source", "target"):
        if side in sides:
            for layer in layers[side]:
                layer.weight = layer.weight.index_select(0, index)
            spec._vocabularies[side] = [names]
    if sides == "no pad":  # CTranslate2's Marian conversion drops the pad piece
        keep = torch.arange(1, len(pieces))
        for layer in (*layers["source"], *layers["target"]):
            layer.weight = layer.weight.index_select(0, keep)
        spec.decoder.projection.bias = spec.decoder.projection.bias.index_select(0, keep)
        spec._vocabularies = {"source": [pieces[1:]], "target": [pieces[1:]]}
    if "target" in sides:
        spec.decoder.projection.bias = spec.decoder.projection.bias.index_select(0, index)
        spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = "<unk>", "<s>", "</s>"
        spec.config.decoder_start_token = "<s>"


def translations(tolk_dir: Path, ct2_dir: Path, beam: int, lines: list[str],
                 compute_type: str = "default") -> tuple[list[Any], list[Any]]:
    """Each engine's best hypothesis (target pieces) for each line, on the same files.

    Beam search without a length penalty: with one, the engines normalise alike (by (n + 1) ** penalty, the end
    counted) but stop differently (Tolk as transformers does, CTranslate2 once its best candidates have ended),
    which is not the import's business; without one, both return the most likely hypothesis the beam found.
    """
    import ctranslate2  # the test modules that call this skip without it

    loaded = checkpoint.load(tolk_dir, device="cpu")
    tok = loaded.tokenizer
    config = GenerationConfig(beam_size=beam, max_new_tokens=MAX_LEN, length_penalty=0.0)
    ours = [tok.pieces(h[0].tokens) for h in generate(loaded.net, [tok.encode(s) for s in lines], config)]
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type=compute_type)
    vocabulary = ct2_dir / "shared_vocabulary.json"
    known = set(json.loads(vocabulary.read_text())) if vocabulary.is_file() else None
    banned = [p for p in bench_converter().banned_pieces(tolk_dir) if known is None or p in known]
    pieces = [tok.source.encode(s, out_type=str) for s in lines]
    results = translator.translate_batch(pieces, beam_size=beam, max_decoding_length=MAX_LEN, length_penalty=0.0,
                                         suppress_sequences=[[p] for p in banned])
    return ours, [r.hypotheses[0] for r in results]


# Hugging Face Marian checkpoints made here, trained for seconds


LANG_CODES = (">>por<<", ">>spa<<")


TRAIN_STEPS = 400  # at most; training stops once greedy outputs end at varied lengths


def source_lines(n: int, seed: int) -> list[str]:
    """Short sentences (at most 6 words), so that most translations end before the length limit."""
    return [" ".join(line.split()[: 1 + i % 6]) for i, line in enumerate(corpus_lines(n, seed))]


def target_lines(n: int, seed: int) -> list[str]:
    """A made-up target language: the source words reversed, with a Portuguese-looking ending."""
    return [" ".join(w[::-1] + "ão" for w in line.split()) for line in source_lines(n, seed)]


def marian_spm(directory: Path, name: str, lines: list[str], vocab_size: int) -> spm.SentencePieceProcessor:
    """Marian's SentencePiece layout: <unk> 0, <s> 1, </s> 2, no pad."""
    (directory / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(directory / f"{name}.txt"), model_prefix=str(directory / name), vocab_size=vocab_size,
        model_type="unigram", character_coverage=1.0, hard_vocab_limit=False, minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_file=str(directory / f"{name}.model"))


def marian_vocab(*models: spm.SentencePieceProcessor) -> list[str]:
    """Marian's joint vocab.json: </s> 0, <unk> 1, the pieces of both sides, language codes, <pad> last."""
    pieces = ["</s>", "<unk>"]
    for sp in models:
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)) and sp.id_to_piece(i) not in pieces:
                pieces.append(sp.id_to_piece(i))
    return pieces + list(LANG_CODES) + ["<pad>"]


def randomize(model: Any, seed: int) -> None:
    """Random weights large enough that the logits depend on every parameter (for logits-only checks)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:
                p.normal_(1.0 if "norm.weight" in name else 0.0, 0.4 if p.dim() > 1 else 0.1)
        model.final_logits_bias.normal_(0.0, 0.5)
    model.eval()


def train_briefly(model: Any, tokenizer: Any, max_steps: int) -> int:
    """Adam steps on source -> made-up target pairs until greedy outputs end at varied lengths (seconds)."""
    src, tgt = source_lines(256, 2), target_lines(256, 2)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    probe = tokenizer(sample_texts(), return_tensors="pt", padding=True)
    for step in range(1, max_steps + 1):
        model.train()
        i = (step * 16) % 256
        batch = tokenizer(src[i : i + 16], text_target=tgt[i : i + 16], return_tensors="pt", padding=True)
        batch["labels"][batch["labels"] == model.config.pad_token_id] = -100
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():  # the decoder starts from <pad>'s zero row, as in every OPUS-MT checkpoint
            model.get_decoder().embed_tokens.weight[model.config.pad_token_id] = 0.0
        if step % 50 == 0:
            with torch.no_grad():
                out = model.eval().generate(**probe, num_beams=1, max_length=24)
            if len({int(n) for n in (out == model.config.eos_token_id).int().argmax(1)}) >= 6:
                break
    model.eval()
    return step


def build_hf_dir(directory: Path, seed: int = 0, steps: int = TRAIN_STEPS, **changes: Any) -> Path:
    """A Hugging Face Marian checkpoint directory, as Helsinki-NLP publishes them, with random weights."""
    import transformers  # the test modules that call this skip without it

    directory.mkdir(parents=True, exist_ok=True)
    src = marian_spm(directory, "source", source_lines(300, 0), 120)
    tgt = marian_spm(directory, "target", target_lines(300, 1), 120)
    shutil.copyfile(directory / "source.model", directory / "source.spm")
    shutil.copyfile(directory / "target.model", directory / "target.spm")
    pieces = marian_vocab(src, tgt)
    (directory / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}), encoding="utf-8")
    V, pad = len(pieces), len(pieces) - 1
    settings: dict[str, Any] = dict(
        vocab_size=V, decoder_vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=128, pad_token_id=pad, eos_token_id=0, forced_eos_token_id=0, bos_token_id=0,
        decoder_start_token_id=pad, activation_function="swish", scale_embedding=True,
        share_encoder_decoder_embeddings=True,
    )
    settings.update(changes)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(transformers.MarianConfig(**settings))
    tokenizer = transformers.MarianTokenizer(
        str(directory / "source.spm"), str(directory / "target.spm"), str(directory / "vocab.json"),
        source_lang="en", target_lang="pt",
    )
    if steps:
        with torch.no_grad():
            model.get_decoder().embed_tokens.weight[pad] = 0.0
        train_briefly(model, tokenizer, steps)
    else:
        randomize(model, seed)
    model.generation_config = transformers.GenerationConfig(
        bad_words_ids=[[pad]], bos_token_id=0, decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
        max_length=24, num_beams=4, pad_token_id=pad, renormalize_logits=True,
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def sample_texts(n: int = 36) -> list[str]:
    lines = source_lines(n - 6, seed=7)
    return lines + ["  Save   changes.  ", "Ação não é possível!", "Unknown zebra quartz 42 ∑.", "x",
                    ">>por<< The file could not be opened.", ">>spa<< Open settings window."]


def load_hf(directory: Path) -> tuple[Any, Any]:
    import transformers

    model = transformers.MarianMTModel.from_pretrained(directory).eval()
    return model, transformers.MarianTokenizer.from_pretrained(directory)


# Training corpora


WORDS_PT = {"the": "o", "file": "arquivo", "could": "pôde", "not": "não", "be": "ser", "opened": "aberto",
            "save": "salvar", "changes": "alterações", "open": "abrir", "settings": "configurações",
            "window": "janela", "error": "erro", "disk": "disco", "full": "cheio", "copy": "copiar"}


def write_corpus(directory: Path, n: int = 300) -> Path:
    """A synthetic parallel corpus: train/dev/test .en and .pt, the Portuguese side word by word."""
    directory.mkdir(parents=True, exist_ok=True)
    en = corpus_lines(n, seed=3)
    pt = [" ".join(WORDS_PT.get(w.lower(), w) for w in line.split()) for line in en]
    cut = {"train": (0, n - 40), "dev": (n - 40, n - 20), "test": (n - 20, n)}
    for split, (a, b) in cut.items():
        (directory / f"{split}.en").write_text("\n".join(en[a:b]) + "\n", encoding="utf-8")
        (directory / f"{split}.pt").write_text("\n".join(pt[a:b]) + "\n", encoding="utf-8")
    return directory


# A model whose source vocabulary was extended


NEW_WORDS = "praia domingo paisagem chovendo neblina avós geleia".split()


def write_text(path: Path) -> Path:
    rng = random.Random(4)
    lines = [" ".join(rng.choice(NEW_WORDS + WORDS) for _ in range(rng.randint(3, 10))) for _ in range(600)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


TRAIN_COMMON = ("--arch", "tiny", "--device", "cpu", "--threads", "1", "--max-tokens", "256", "--eval-every", "1000",
                "--source", "pt", "--target", "en")


def trained_copy(tmp_path: Path) -> tuple[Path, Path]:
    """A pt-en model of the tiny architecture trained by `tolk train` (2 steps) on write_corpus's corpus, and its copy
    with a source vocabulary of its own: (corpus, copy)."""
    from tests.tiny import train_spm

    corpus, spm_path = write_corpus(tmp_path / "corpus"), train_spm(tmp_path / "spm")
    common = ("--corpus", str(corpus), *TRAIN_COMMON)
    first = tmp_path / "first"
    assert tolk(["train", *common, "--spm", str(spm_path), "--run", str(first), "--max-steps", "2",
                 "--save-every", "2"]) == 0
    assert tolk(["train", *common, "--run", str(first), "--export", str(tmp_path / "model"), "--average", "1"]) == 0
    ext = tmp_path / "extended"
    assert tolk(["extend-source-vocab", str(tmp_path / "model"), str(ext), "--text", str(corpus / "train.pt"),
                 str(write_text(tmp_path / "pt.txt")), "--vocab-size", "60", "--pieces", "30"]) == 0
    return corpus, ext


# Datasets to translate, in every format, and the jobs that translate them


ROOT = Path(__file__).resolve().parents[1]


ROWS = 2000


FORMATS = ("parquet", "jsonl", "csv")


EXT = {"parquet": "parquet", "jsonl": "jsonl", "csv": "csv"}


TOLK = [sys.executable, "-c", "import sys; from server.cli import main; sys.exit(main(sys.argv[1:]))"]


def make_rows(n: int = ROWS, seed: int = 3) -> list[dict[str, Any]]:
    """Rows of mixed lengths: repeats, null, empty and blank cells, several sentences, line breaks, placeholders,
    a sentence longer than the model takes, a NUL (refused as the server refuses it), and columns that are not
    text."""
    rng = random.Random(seed)
    base = corpus_lines(120, seed=11)
    rows = []
    for i in range(n):
        r = rng.random()
        if r < 0.05:
            text: str | None = None
        elif r < 0.09:
            text = ""
        elif r < 0.11:
            text = "  "
        elif r < 0.35:
            text = base[rng.randrange(15)]  # the same few sentences, again and again
        elif r < 0.45:
            text = " ".join(rng.sample(base, rng.randint(2, 5)))
        elif r < 0.52:
            text = "\n".join(rng.sample(base, 3))
        elif r < 0.54:
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(150, 300)))  # cut to fit 128 positions
        elif r < 0.56:
            text = f"Save {{0}} to %s before closing {rng.choice(base)}"
        elif r < 0.57:
            text = "Open the\x00file."
        else:
            text = rng.choice(base)
        rows.append({"id": i, "text": text, "score": round(rng.random(), 6), "flag": rng.random() < 0.5,
                     "tags": [rng.choice("abc") for _ in range(rng.randint(0, 2))]})
    return rows


def write_input(rows: list[dict[str, Any]], fmt: str, path: Path) -> Path:
    """The rows as a file of the format (CSV without the list column, which CSV cannot hold)."""
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=700)  # groups across blocks
    elif fmt == "jsonl":
        with open(path, "w") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    else:
        pcsv.write_csv(pa.Table.from_pylist([{k: v for k, v in r.items() if k != "tags"} for r in rows]), path)
    return path


def read_output(fmt: str, path: Path) -> list[dict[str, Any]]:
    """An output file's rows, read by pyarrow or json alone (CSV: a cell empty without quotes is null)."""
    if fmt == "parquet":
        return pq.read_table(path).to_pylist()  # type: ignore[no-any-return]
    if fmt == "jsonl":
        return [json.loads(line) for line in path.read_text().split("\n") if line]
    table = pcsv.read_csv(path, parse_options=pcsv.ParseOptions(newlines_in_values=True),
                          convert_options=pcsv.ConvertOptions(strings_can_be_null=True,
                                                              quoted_strings_can_be_null=False))
    return table.to_pylist()  # type: ignore[no-any-return]


@functools.cache
def reference(model: Path, rows: int = ROWS) -> tuple[str, ...]:
    """`tolk translate` of every line of every cell it can take, in order."""
    return reference_of(model, tuple(line for row in make_rows(rows)
                                     if isinstance(row["text"], str) and "\x00" not in row["text"]
                                     for line in row["text"].split("\n")))


def reference_of(model: Path, lines: tuple[str, ...]) -> tuple[str, ...]:
    """`tolk translate` (float32, its default) of these lines."""
    out = io.StringIO()
    stdin = sys.stdin
    try:
        sys.stdin = io.StringIO("".join(f"{line}\n" for line in lines))
        with contextlib.redirect_stdout(out):
            assert cli.main(["translate", "--model", str(model), "--dtype", "float32"]) == 0
    finally:
        sys.stdin = stdin
    translated = tuple(out.getvalue().split("\n")[:-1])
    assert len(translated) == len(lines)
    return translated


def assert_translated(fmt: str, rows: list[dict[str, Any]], out: list[dict[str, Any]],
                      expected: tuple[str, ...]) -> None:
    """Row by row: the other columns as they were, each translation `tolk translate`'s lines joined by its newlines,
    null cells null, NUL refused in the error column."""
    assert len(out) == len(rows)
    lines = iter(expected)
    for row, got in zip(rows, out, strict=True):
        kept = {k: v for k, v in got.items() if k not in ("text_pt", "text_pt_error")}
        assert kept == ({k: v for k, v in row.items() if k != "tags"} if fmt == "csv" else row)
        text = row["text"]
        if text is None:
            assert got["text_pt"] is None and got["text_pt_error"] is None
        elif "\x00" in text:
            assert got["text_pt"] is None and "U+0000" in got["text_pt_error"]
        else:
            assert got["text_pt_error"] is None
            assert got["text_pt"].split("\n") == [next(lines) for _ in text.split("\n")], row
    assert next(lines, None) is None


def translate_dataset(source: Path, output: Path, model: Path, *more: str) -> int:
    return cli.main(["translate-dataset", str(source), str(output), "--column", "text", "--source", "en",
                     "--target", "pt", "--model", str(model), "--dtype", "float32", "--threads", "1", "--quiet",
                     *more])


def run_killed(command: list[str], parts: Path, at_least: int) -> None:
    """Start the command, SIGKILL it once `parts` holds at_least parts, and check it had not finished."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while len(list(parts.glob("part-*"))) < at_least:
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL

