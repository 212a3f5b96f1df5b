"""Kernels compiled ahead of time: can a decoding process run model/kernels.py's compiled code without numba?

Issue 18's last target is peak memory within 10% of CTranslate2's, and what is left of the gap is numba's runtime
in the decoding process (docs/benchmarks.md, "Where the memory gap is"). This probes the way out: a few of the
kernels (LayerNorm, attention over each row's length, the float32 panels and the int8 byte products, the last two
written with LLVM intrinsics) compiled by `numba.pycc` into an extension module, with the Python wrapper releasing
the GIL as `nogil=True` does (pycc's own wrappers keep it). Then, each in a fresh process, the same calls on the
same inputs through the extension and through the JIT-compiled kernels (from numba's cache, warmed first):
- whether the extension's process imported numba at all;
- resident memory after the imports and after the calls (VmRSS, VmHWM);
- the outputs, bit for bit against the JIT's;
- the float32 panels called from two threads at once against one after the other (the fused step's helper
  threads need the GIL released).
Prints a table and writes JSON. Needs a C compiler (pycc links the extension). Never run by the test suite.

    python bench/aot_probe.py [--out bench/results/aot-probe.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from int8_products import cpu_flags  # noqa: E402

MODULE = "tolk_aot_probe"

BUILD = r'''
import sys
sys.path.insert(0, {root!r})
import numba.pycc.compiler as pycc_compiler
from numba.core.compiler import Flags


class ReleasingFlags(Flags):  # what nogil=True sets for njit: the Python wrapper lets go of the GIL around the call
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.release_gil = True


pycc_compiler.Flags = ReleasingFlags
from numba.pycc import CC
from model import kernels as K

cc = CC({module!r})
cc.output_dir = {out!r}
cc.target_cpu = "host"


@cc.export("norm", "void(f4[:,::1], f4[::1], f4[::1], f4, f4[:,::1])")
def norm(x, w, b, eps, out):
    K._norm(x, w, b, eps, out)


@cc.export("attend_rows", "void(f4[:,::1], f4[:,:,:,:], f4[:,:,:,:], i8[::1], f4[:,::1], f4[:,::1])")
def attend_rows(q, k, v, lengths, out, weights):
    K.attend_rows(q, k, v, lengths, out, weights)


@cc.export("panel_rows", "void(f4[:,::1], f4[:,::1], f4[::1], f4[::1], i8, f4[:,::1], i8, i8)")
def panel_rows(x, w, scale, bias, act, y, j0, j1):
    K._panel_rows(x, w, scale, bias, act, y, j0, j1)


@cc.export("byte_dots", "void(u1[:,::1], i1[:,::1], i4[:,::1])")
def byte_dots(xq, w, dots):
    K._byte_dots(xq, w, dots)


cc.compile()
'''

# The same calls in a fresh process, through the extension ("aot") or numba's kernels ("jit"); inputs from a file.
RUN = r'''
import json, sys, threading, time
def status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {{k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}}
import numpy as np
before = status()
if {way!r} == "aot":
    sys.path.insert(0, {out!r})
    import {module} as m
    norm, attend_rows, panel_rows, byte_dots = m.norm, m.attend_rows, m.panel_rows, m.byte_dots
else:
    sys.path.insert(0, {root!r})
    from model import kernels as K
    norm, attend_rows, panel_rows, byte_dots = K._norm, K.attend_rows, K._panel_rows, K._byte_dots
imported = status()
d = dict(np.load({inputs!r}))
outs = {{"norm": np.empty_like(d["x"]), "attend": np.zeros_like(d["q"]),
        "panels": np.zeros((d["x"].shape[0], d["w"].shape[0]), np.float32),
        "bytes": np.zeros((d["xq"].shape[0], d["wb"].shape[0]), np.int32)}}
norm(d["x"], d["nw"], d["nb"], np.float32(1e-5), outs["norm"])
attend_rows(d["q"], d["k"], d["v"], d["lengths"], outs["attend"], np.zeros((0, d["k"].shape[2]), np.float32))
N = d["w"].shape[0]
one, zero = np.ones(N, np.float32), np.zeros(N, np.float32)
panel_rows(d["x"], d["w"], one, zero, 1, outs["panels"], 0, N)
byte_dots(d["xq"], d["wb"], outs["bytes"])
called = status()
ys = [np.zeros_like(outs["panels"]) for _ in range(2)]
def loop(i, n=100):
    for _ in range(n):
        panel_rows(d["x"], d["w"], one, zero, 0, ys[i], 0, N)
loop(0, 10)
start = time.perf_counter(); loop(0); loop(1); serial = time.perf_counter() - start
threads = [threading.Thread(target=loop, args=(i,)) for i in range(2)]
start = time.perf_counter(); [t.start() for t in threads]; [t.join() for t in threads]
parallel = time.perf_counter() - start
np.savez({result!r}, **outs)
print(json.dumps({{"numba_imported": "numba" in sys.modules, "before_imports": before, "after_imports": imported,
                   "after_calls": called, "serial_s": serial, "two_threads_s": parallel}}))
'''


def inputs(path: Path) -> None:
    import numpy as np

    from model import kernels as K

    rng = np.random.default_rng(0)
    R, H, T, Dh, D, N = 8, 8, 64, 64, 512, 2048
    np.savez(path, x=rng.standard_normal((8, D)).astype(np.float32), nw=rng.random(D).astype(np.float32),
             nb=rng.random(D).astype(np.float32), q=rng.standard_normal((R, H * Dh)).astype(np.float32),
             k=rng.standard_normal((R, H, T, Dh)).astype(np.float32),
             v=rng.standard_normal((R, H, T, Dh)).astype(np.float32), lengths=np.arange(R, dtype=np.int64) * 7 + 9,
             w=K.pack_panels(rng.standard_normal((N, D)).astype(np.float32)),
             xq=rng.integers(0, 128, (8, D)).astype(np.uint8),
             wb=K.pack_byte_panels(rng.integers(-127, 128, (N, D)).astype(np.int8)))


def run(way: str, work: Path) -> dict[str, Any]:
    code = RUN.format(way=way, out=str(work), module=MODULE, root=str(ROOT), inputs=str(work / "inputs.npz"),
                      result=str(work / f"{way}.npz"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/aot-probe.json")
    args = p.parse_args()
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        inputs(work / "inputs.npz")
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", BUILD.format(root=str(ROOT), module=MODULE, out=str(work))],
                       check=True, capture_output=True)
        build_s = time.perf_counter() - start
        size = sum(f.stat().st_size for f in work.glob(f"{MODULE}*.so"))
        run("jit", work)  # fills numba's cache for these calls: the measured run loads, as a server's would
        ways = {way: run(way, work) for way in ("jit", "aot")}
        jit, aot = np.load(work / "jit.npz"), np.load(work / "aot.npz")
        equal = {name: bool(np.array_equal(jit[name], aot[name])) for name in jit.files}
        largest = {name: float(np.abs(jit[name].astype(np.float64) - aot[name]).max()) for name in jit.files}
    print(f"built {MODULE}: {size / 1e6:.2f} MB in {build_s:.1f} s")
    print("| way | numba imported | RSS after numpy MB | after the imports | after the calls | peak | "
          "two threads / one after the other |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for way, r in ways.items():
        print(f"| {way} | {r['numba_imported']} | {r['before_imports']['VmRSS']:.0f} | "
              f"{r['after_imports']['VmRSS']:.0f} | {r['after_calls']['VmRSS']:.0f} | "
              f"{r['after_calls']['VmHWM']:.0f} | {r['serial_s'] / r['two_threads_s']:.2f}x |")
    print("outputs equal bit for bit:", equal, "largest difference:", largest)
    result = {"cpu_flags": cpu_flags(), "python": sys.version.split()[0], "numba": __import__("numba").__version__,
              "build_seconds": round(build_s, 2), "extension_bytes": size, "ways": ways, "equal": equal,
              "largest_difference": largest, "date": time.strftime("%Y-%m-%d %H:%M")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
