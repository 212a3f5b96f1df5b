"""Run Tolk's built image and check it as a user of the container would meet it (called by deploy/test-image.sh).

The container runs with the image's own command and defaults (int8 on the CPU, port 8000 inside). Checked: `/ready`
within the start period; each shipped direction translates a sentence exactly as this checkout's engine does with the
same weights and settings (one sentence per request, so int8 batches of one on both sides); a streamed answer is the
plain one; `/metrics` exports Tolk's metrics; the server runs as uid 10001; its processes decode with the kernels the
image compiled ahead, numba never loaded (the image is built on the machine that runs it here); the image's HEALTHCHECK
command passes; and on SIGTERM a request already in flight is answered in full before the process exits with status 0.
Standard library only on the HTTP side; the expected translations come from `model/`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = {
    ("en", "pt"): ["The file could not be saved.", "Please enter your password to continue."],
    ("pt", "en"): ["Não foi possível salvar o arquivo.", "Por favor, digite sua senha para continuar."],
}
# A request that keeps the server busy for a few seconds, so that SIGTERM arrives while it is in flight: distinct
# sentences (the translation cache would answer repeats), each made to run long.
DRAIN_TEXTS = [f"Step {i}: open the settings, choose the folder number {i} and save the file again." for i in range(48)]
DRAIN_OPTIONS = {"beam_size": 4, "min_new_tokens": 120, "max_new_tokens": 128}


# Run inside the container: which of its processes have the kernels compiled ahead (model/native.py) mapped, and
# which have numba's compiler (llvmlite) mapped.
MAPPED = """
import json, pathlib
seen = {"ahead": [], "numba": []}
for proc in pathlib.Path("/proc").glob("[0-9]*"):
    try:
        maps = (proc / "maps").read_text()
    except OSError:
        continue
    if "tolk_kernels" in maps:
        seen["ahead"].append(int(proc.name))
    if "llvmlite" in maps:
        seen["numba"].append(int(proc.name))
print(json.dumps(seen))
"""


class CheckFailed(Exception):
    pass


def http(url: str, body: dict[str, Any] | None = None, timeout: float = 120) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise CheckFailed(what)
    print(f"  ok: {what}", flush=True)


class Container:
    def __init__(self, podman: list[str], image: str, name: str, port: int) -> None:
        self.podman, self.image, self.name, self.port = podman, image, name, port
        self.url = f"http://127.0.0.1:{port}"

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.podman, *args], capture_output=True, text=True, check=check)

    def start(self) -> None:
        # No health timer: it needs systemd, which a CI machine may lack; `podman healthcheck run` runs the check.
        self.run("run", "--detach", "--name", self.name, "--publish", f"127.0.0.1:{self.port}:8000",
                 "--health-interval", "disable", self.image)

    def state(self) -> dict[str, Any]:
        out = self.run("inspect", self.name, "--format", "{{json .State}}").stdout
        return dict(json.loads(out))

    def logs(self) -> str:
        done = self.run("logs", self.name, check=False)
        return done.stdout + done.stderr

    def wait_ready(self, limit: float) -> float:
        start = time.monotonic()
        while time.monotonic() - start < limit:
            if not self.state().get("Running"):
                raise CheckFailed(f"the container exited before /ready:\n{self.logs()}")
            try:
                if http(f"{self.url}/ready", timeout=2)[0] == 200:
                    return time.monotonic() - start
            except OSError:
                pass
            time.sleep(0.5)
        raise CheckFailed(f"/ready did not answer 200 within {limit:.0f} s:\n{self.logs()}")


def engine_translations() -> dict[tuple[str, str], list[str]]:
    """What this checkout's engine makes of SENTENCES with the shipped weights and the server's CPU defaults."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # as model/__init__.py sets it, before torch loads libgomp
    import torch

    from model import checkpoint
    from model.search import generate

    torch.set_num_threads(1)  # the server's scheduler decodes with one thread on a 2-core machine
    out = {}
    for (src, tgt), texts in SENTENCES.items():
        m = checkpoint.load(ROOT / "weights" / f"{src}-{tgt}", device="cpu", dtype="int8")
        out[src, tgt] = [m.tokenizer.decode(generate(m.net, [m.tokenizer.encode(t)], m.generation)[0][0].tokens)
                         for t in texts]
    return out


def streamed_text(url: str, body: dict[str, Any]) -> tuple[str, str]:
    """A `/translate/stream` answer of one text: its token pieces joined, and the text of its `done` event."""
    req = urllib.request.Request(f"{url}/translate/stream", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    pieces, done, event = [], "", ""
    with urllib.request.urlopen(req, timeout=120) as resp:
        for raw in resp:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                if event == "error":
                    raise CheckFailed(f"the stream answered an error: {data}")
                if event == "token":
                    pieces.append(data["token"]["text"])
                elif event == "done":
                    done = data["translatedText"]
    return "".join(pieces), done


def check(c: Container, ready_limit: float) -> None:
    expected = engine_translations()
    c.start()
    print(f"  ok: /ready after {c.wait_ready(ready_limit):.1f} s", flush=True)
    for (src, tgt), texts in SENTENCES.items():
        for text, want in zip(texts, expected[src, tgt], strict=True):
            status, body = http(f"{c.url}/translate", {"q": text, "source": src, "target": tgt})
            got = json.loads(body).get("translatedText") if status == 200 else body.decode()
            expect(status == 200 and got == want, f"{src}->{tgt} {text!r} -> {got!r} (engine: {want!r})")
    text = SENTENCES["en", "pt"][0]
    pieces, done = streamed_text(c.url, {"q": text, "source": "en", "target": "pt"})
    expect(pieces.strip() == done == expected["en", "pt"][0], f"streamed == plain: {pieces!r}, done {done!r}")
    glossary = {"name": "image check", "source_lang": "en", "target_lang": "pt", "entries": "file\tficheiro\n",
                "entries_format": "tsv"}
    status, body = http(f"{c.url}/glossaries", glossary)
    expect(status == 201, f"a glossary is kept in the image's data directory ({status})")
    request = {"q": text, "source": "en", "target": "pt", "glossary_id": json.loads(body)["glossary_id"]}
    status, body = http(f"{c.url}/translate", request)
    got = json.loads(body).get("translatedText", "") if status == 200 else body.decode()
    expect("ficheiro" in got.lower(), f"the glossary's term is in the translation: {got!r}")
    status, metrics = http(f"{c.url}/metrics")
    names = {"tolk_requests_total", "tolk_generated_tokens_total", "tolk_decode_step_seconds_bucket"}
    found = {n for n in names if n in metrics.decode()}
    expect(status == 200 and found == names, f"/metrics exports {sorted(names)}")
    mapped = json.loads(c.run("exec", c.name, "python", "-c", MAPPED).stdout)
    expect(bool(mapped["ahead"]) and not mapped["numba"],
           f"the server decodes with the kernels compiled ahead, without numba (processes {mapped})")
    uid = c.run("exec", c.name, "id", "-u").stdout.strip()
    expect(uid == "10001", f"the server runs as uid {uid}")
    health = c.run("healthcheck", "run", c.name, check=False)
    expect(health.returncode == 0, f"the image's HEALTHCHECK command passes ({health.stdout.strip() or 'healthy'})")
    check_drain(c)


def check_drain(c: Container) -> None:
    """SIGTERM (the image's STOPSIGNAL, sent by `podman stop`) while a long request is in flight."""
    answer: dict[str, Any] = {}

    def send() -> None:
        body = {"q": DRAIN_TEXTS, "source": "en", "target": "pt", "options": DRAIN_OPTIONS}
        started = time.monotonic()
        try:
            answer["status"], answer["body"] = http(f"{c.url}/translate", body, timeout=300)
        except OSError as e:
            answer["error"] = repr(e)
        answer["seconds"] = time.monotonic() - started

    client = threading.Thread(target=send)
    client.start()
    time.sleep(1.0)  # the request is admitted and decoding
    expect(client.is_alive(), f"the drain request is still in flight when SIGTERM is sent ({answer})")
    stopped = time.monotonic()
    c.run("stop", "--time", "120", c.name)
    client.join()
    state = c.state()
    print(f"  request answered after {answer.get('seconds', 0):.1f} s; stopped after "
          f"{time.monotonic() - stopped:.1f} s", flush=True)
    texts = json.loads(answer["body"]).get("translatedText", []) if answer.get("status") == 200 else []
    expect(answer.get("status") == 200 and len(texts) == len(DRAIN_TEXTS) and all(texts),
           f"the in-flight request got all {len(DRAIN_TEXTS)} translations ({answer.get('status', answer)})")
    expect(state.get("ExitCode") == 0 and not state.get("OOMKilled"),
           f"the server exited with status {state.get('ExitCode')} on SIGTERM")
    logs = c.logs()
    expect("Finished server process" in logs, "uvicorn logged a clean shutdown")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--podman", required=True, help="the podman command with its global options")
    parser.add_argument("--image", required=True)
    # Each run its own container name and port, so that two checks on one machine (two clones' CI) never meet.
    parser.add_argument("--name", default=f"tolk-image-check-{os.getpid()}")
    parser.add_argument("--port", type=int, default=0, help="the host port (default: a free one)")
    parser.add_argument("--ready-within", type=float, default=120.0, metavar="SECONDS")
    args = parser.parse_args()
    if not args.port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args.port = s.getsockname()[1]
    c = Container(shlex.split(args.podman), args.image, args.name, args.port)
    try:
        check(c, args.ready_within)
    except (CheckFailed, subprocess.CalledProcessError) as e:
        detail = e.stderr if isinstance(e, subprocess.CalledProcessError) else ""
        print(f"image check FAILED: {e}\n{detail}", file=sys.stderr)
        return 1
    finally:
        c.run("rm", "--force", "--time", "0", c.name, check=False)
    print("image check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
