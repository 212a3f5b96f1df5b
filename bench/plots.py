"""PNG plots of benchmark rows (matplotlib, bench extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def throughput_plot(benchmarks: dict[str, list[dict[str, Any]]], path: Path) -> None:
    """Generated tokens/s against batch size, one line per engine; a row of panels (greedy, beam) per benchmark."""
    decodings = list(dict.fromkeys(r["decoding"] for rows in benchmarks.values() for r in rows))
    fig, axes = plt.subplots(len(benchmarks), len(decodings), figsize=(5.5 * len(decodings), 4 * len(benchmarks)),
                             squeeze=False)
    engines = list(dict.fromkeys(r["engine"] for rows in benchmarks.values() for r in rows))
    colors = {e: f"C{i}" for i, e in enumerate(engines)}  # one colour per engine in every panel
    for axes_row, (title, rows) in zip(axes, benchmarks.items(), strict=True):
        for ax, decoding in zip(axes_row, decodings, strict=True):
            batches = sorted({r["batch"] for r in rows})
            for engine in dict.fromkeys(r["engine"] for r in rows):
                points = sorted((r["batch"], r["tokens_per_s"]) for r in rows
                                if r["engine"] == engine and r["decoding"] == decoding)
                ax.plot([b for b, _ in points], [t for _, t in points], marker="o", label=engine, color=colors[engine],
                        linestyle="--" if "int8" in engine else "-")
            ax.set_xscale("log", base=2)
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.set_title(f"{title}: {decoding}", fontsize=10)
            ax.set_xlabel("batch size (sentences)")
            ax.set_ylabel("generated tokens/s")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_plot(phases: list[dict[str, Any]], title: str, path: Path) -> None:
    """The server under load (bench/serve.py's phases): sentences/s and latency against concurrent clients."""
    fig, (speed, latency) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (server, stream) in enumerate([("batched", False), ("unbatched", False), ("batched", True),
                                          ("unbatched", True)]):
        rows = sorted((r for r in phases if r["server"] == server and r["stream"] == stream),
                      key=lambda r: r["clients"])
        if not rows:
            continue
        clients = [r["clients"] for r in rows]
        label, style = f"{server}{', streamed' if stream else ''}", "--" if stream else "-"
        speed.plot(clients, [r["sentences_per_s"] for r in rows], marker="o", linestyle=style, color=f"C{i}",
                   label=label)
        if stream:  # a stream's latency is its time to first token
            latency.plot(clients, [r["ttft_p50_ms"] for r in rows], marker="o", linestyle=style, color=f"C{i}",
                         label=f"{label}: time to first token p50")
        else:
            latency.plot(clients, [r["latency_p50_ms"] for r in rows], marker="o", color=f"C{i}", label=f"{label} p50")
            latency.plot(clients, [r["latency_p99_ms"] for r in rows], marker="x", linestyle=":", color=f"C{i}",
                         label=f"{label} p99")
    ticks = sorted({r["clients"] for r in phases})
    for ax, ylabel in ((speed, "sentences/s"), (latency, "ms per request")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(c) for c in ticks])
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    latency.set_yscale("log")
    speed.set_title(f"{title}: throughput", fontsize=10)
    latency.set_title(f"{title}: latency", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":  # redraw the load plots from serve.py's JSON: python bench/plots.py RESULT.json...
    import json
    import sys

    for name in sys.argv[1:]:
        result = json.loads(Path(name).read_text())
        load_plot(result["phases"], Path(name).stem, Path(name).with_suffix(".png"))
        print(f"wrote {Path(name).with_suffix('.png')}")
