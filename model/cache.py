"""Per-layer KV caches in preallocated rows, for incremental decoding of many sequences at once.

A row holds one decoding sequence (one beam). Self-attention K/V of row b are written at its own position,
so rows of different ages share one decode step. Cross-attention K/V are computed once, when a row is admitted.
The active rows are always 0..n-1 (the caller keeps them packed with `copy_rows`), so a decode step works on
views of the buffers and never gathers or reallocates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class LayerCache:
    """One decoder layer's buffers: self K/V (R, H, T, Dh) and cross K/V (R, H, S, Dh)."""

    k: Tensor
    v: Tensor
    ck: Tensor
    cv: Tensor

    def write_self(self, B: int, pos: Tensor, k: Tensor, v: Tensor, T: int) -> tuple[Tensor, Tensor]:
        """Store the new token's K/V (B, H, 1, Dh) at each row's position; return K/V of rows 0..B-1 up to T."""
        rows = torch.arange(B, device=pos.device)
        self.k[rows, :, pos] = k[:, :, 0]
        self.v[rows, :, pos] = v[:, :, 0]
        return self.k[:B, :, :T], self.v[:B, :, :T]

    def cross(self, B: int, S: int) -> tuple[Tensor, Tensor]:
        return self.ck[:B, :, :S], self.cv[:B, :, :S]


class KVCache:
    """All decoder layers' caches for `rows` sequences of up to `max_tgt` tokens over sources of `max_src`."""

    def __init__(
        self,
        n_layers: int,
        rows: int,
        n_heads: int,
        head_dim: int,
        max_src: int,
        max_tgt: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        def buf(T: int) -> Tensor:
            return torch.zeros(rows, n_heads, T, head_dim, device=device, dtype=dtype)

        self.layers = [LayerCache(buf(max_tgt), buf(max_tgt), buf(max_src), buf(max_src)) for _ in range(n_layers)]
        self.rows, self.max_src, self.max_tgt = rows, max_src, max_tgt
        self.pos = torch.zeros(rows, dtype=torch.long, device=device)  # next write position per row
        self.src_mask = torch.zeros(rows, max_src, dtype=torch.bool, device=device)  # True = real source token
        # Host-side upper bounds over the active rows (largest position, longest source), so a step slices
        # the buffers without a device sync.
        self.t_hi = 0
        self.s_hi = 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for lc in self.layers for t in (lc.k, lc.v, lc.ck, lc.cv))

    def admit(self, start: int, cross_kv: list[tuple[Tensor, Tensor]], src_mask: Tensor) -> None:
        """Fill rows start..start+B-1 with fresh sequences: cross K/V per layer (B, H, S, Dh), mask (B, S)."""
        B, S = src_mask.shape
        if self.max_src < S:
            raise ValueError(f"source of {S} tokens exceeds the cache's max_src {self.max_src}")
        end = start + B
        for lc, (ck, cv) in zip(self.layers, cross_kv, strict=True):
            lc.ck[start:end, :, :S] = ck
            lc.cv[start:end, :, :S] = cv
        self.src_mask[start:end] = False
        self.src_mask[start:end, :S] = src_mask
        self.pos[start:end] = 0
        self.s_hi = max(self.s_hi, S)

    def advance(self, B: int) -> None:
        """Rows 0..B-1 each took one token."""
        self.pos[:B] += 1
        self.t_hi += 1

    def copy_rows(self, src: Tensor, dst: Tensor, cross: bool = True) -> None:
        """Row dst[i] becomes a copy of row src[i] (beam reordering, packing). Overlap is safe."""
        T, S = min(self.t_hi + 1, self.max_tgt), self.s_hi  # nothing beyond these is ever read
        for lc in self.layers:
            lc.k[dst, :, :T] = lc.k[src, :, :T]
            lc.v[dst, :, :T] = lc.v[src, :, :T]
            if cross:
                lc.ck[dst, :, :S] = lc.ck[src, :, :S]
                lc.cv[dst, :, :S] = lc.cv[src, :, :S]
        self.pos[dst] = self.pos[src]
        if cross:
            self.src_mask[dst] = self.src_mask[src]

    def shrink(self, n_active: int) -> None:
        """Recompute the slicing bounds after rows left (one device sync, only when rows leave)."""
        if n_active == 0:
            self.t_hi = self.s_hi = 0
            return
        self.t_hi = int(self.pos[:n_active].max())
        self.s_hi = int(self.src_mask[:n_active].sum(1).max())
