"""The decode step of one KV cache replayed as CUDA graphs, one graph per bucket of row counts.

A decode step of a small model is dozens of short kernels; launched one by one from Python, the launches take
longer than the kernels (the GPU waits on the host). A CUDA graph records the step's kernels once and replays them
with one launch. A graph fixes its shapes and addresses, so the step it records is `decode_step_fixed`: attention
over the whole cache buffers with masks, positions read on the device, and a fixed number of rows. Steps of B active
rows replay the graph of the smallest bucket >= B; the extra rows are free rows, whose results nobody reads.

Graphs are recorded when the batch is created, while every row is free, because recording needs warm-up runs that
write into the cache. The same code runs eagerly (`capture=False`) on any device, which is how the CPU tests check
it against the ordinary step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from model.cache import KVCache
from model.frozen import FrozenTransformer

WARMUP = 2  # eager runs of a bucket before it is recorded (cuBLAS and the allocator settle on a side stream)


def buckets(rows: int) -> list[int]:
    """Row counts that get a graph: powers of two below `rows`, then `rows` itself."""
    sizes, b = [], 1
    while b < rows:
        sizes.append(b)
        b *= 2
    return [*sizes, rows]


@dataclass
class Recorded:
    graph: torch.cuda.CUDAGraph
    logits: Tensor  # (b, V): the graph's output buffer, overwritten by each replay


class GraphedStep:
    """`decode_step` of one cache through recorded graphs (CUDA) or the same fixed-shape step run eagerly."""

    def __init__(self, net: FrozenTransformer, cache: KVCache, tokens: Tensor | None = None,
                 capture: bool = True) -> None:
        """tokens: the graphs' input buffer (cache.rows,), kept by the caller so that a step's tokens need no copy
        into it; a buffer of its own when None."""
        self.net, self.cache = net, cache
        self.tokens = tokens if tokens is not None else torch.zeros(cache.rows, dtype=torch.long,
                                                                    device=cache.pos.device)
        self.sizes = buckets(cache.rows)
        self.recorded: dict[int, Recorded] = {}
        if capture:
            self._record()

    def _record(self) -> None:
        cache = self.cache
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # unannotated in torch
        side.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(side):
            for b in self.sizes:
                for _ in range(WARMUP):
                    self.net.decode_step_fixed(self.tokens[:b], cache)
        torch.cuda.current_stream().wait_stream(side)
        with torch.inference_mode():
            for b in reversed(self.sizes):  # largest first: smaller graphs reuse its pool's blocks
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    logits = self.net.decode_step_fixed(self.tokens[:b], cache)
                self.recorded[b] = Recorded(graph, logits)
        cache.pos.zero_()  # the warm-up runs moved every row; recording itself runs nothing
        torch.cuda.synchronize()

    def bucket(self, B: int) -> int:
        return next(b for b in self.sizes if b >= B)

    def __call__(self, tokens: Tensor, align: list[Tensor] | None = None) -> Tensor:
        """Advance rows 0..B-1 by one token each: tokens (B,) -> logits (B, V), a tensor of the caller's own.

        A step that asks for alignment (`FrozenTransformer.decode_step`) runs the recorded step eagerly: the
        graphs hold no attention weights.
        """
        B = tokens.shape[0]
        b = self.bucket(B)
        if tokens.data_ptr() != self.tokens.data_ptr() or tokens.stride() != self.tokens.stride():
            self.tokens[:B].copy_(tokens)
        if align is not None:
            logits = self.net.decode_step_fixed(self.tokens[:b], self.cache, align)[:B]
            align[-1] = align[-1][:B]
        elif self.recorded:
            self.recorded[b].graph.replay()
            logits = self.recorded[b].logits[:B]
        else:
            logits = self.net.decode_step_fixed(self.tokens[:b], self.cache)[:B]
        self.cache.advance(B, on_device=False)
        return logits.to(torch.float32, copy=True)
