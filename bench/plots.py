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
