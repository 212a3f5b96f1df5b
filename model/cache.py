"""The KV cache of all decoder layers in preallocated rows, for incremental decoding of many sequences at once.

A row holds one decoding sequence (one beam). Self-attention K/V of row b are written at its own position,
so rows of different ages share one decode step. Cross-attention K/V are computed once, when a row is admitted.
The active rows are always 0..n-1 (the caller keeps them packed with `copy_rows`), so a decode step works on
views of the buffers and never gathers or reallocates. All layers live in one buffer per kind, so admitting
rows is one copy, whatever the depth.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

HOST_COPY = (torch.float32, torch.float16)  # cache dtypes numpy holds (bfloat16 it does not)

try:  # numba's (or compiled ahead); without it (the GPU script's bare machine) numpy's fancy indexing moves rows
    from model.beam_host import move_rows
except (ImportError, RuntimeError):  # pragma: no cover - RuntimeError: numba finds no writable cache
    move_rows = None  # type: ignore[assignment]


class KVCache:
    """All decoder layers' K/V for `rows` sequences of up to `max_tgt` tokens over sources of up to `max_src`."""

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
        zeroed: bool = True,
    ) -> None:
        """zeroed=False: the K/V buffers are left as allocated, for a step that reads each row's keys up to its own
        length only (a masked step reads them all, and what it makes of garbage under its mask is its kernel's
        affair). Pages a batch never reaches are then never touched: about 2 ms of zeroing per 32-row offline
        batch on the shipped model."""

        def buf(T: int) -> Tensor:
            new = torch.zeros if zeroed else torch.empty
            return new(n_layers, 2, rows, n_heads, T, head_dim, device=device, dtype=dtype)

        self.self_kv = buf(max_tgt)  # (L, 2, R, H, T, Dh): K and V of the target tokens so far
        self.cross_kv = buf(max_src)  # (L, 2, R, H, S, Dh): K and V of the source
        self.rows, self.max_src, self.max_tgt = rows, max_src, max_tgt
        self.pos = torch.zeros(rows, dtype=torch.long, device=device)  # next write position per row
        self.src_mask = torch.zeros(rows, max_src, dtype=torch.bool, device=device)  # True = real source token
        self.row_ids = torch.arange(rows, device=device)
        self.t_ids = torch.arange(max_tgt, device=device)
        # Host-side bounds over the active rows, so a step slices the buffers without a device sync:
        # positions t_lo..t_hi, source lengths s_lo..s_hi. Equal bounds mean no key is padding: no mask.
        self.t_lo = self.t_hi = 0
        self.s_lo = self.s_hi = 0
        self._host: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._scratch: dict[str, Tensor] = {}
        self._transit = np.empty(0, np.float32)

    def host_views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """pos, src_mask, self_kv and cross_kv as numpy arrays over the same memory (CPU only): what the fused step
        (model.fused_step) reads and writes. Made once: the buffers never move."""
        if self._host is None:
            self._host = (self.pos.numpy(), self.src_mask.numpy(), self.self_kv.numpy(), self.cross_kv.numpy())
        return self._host

    def scratch(self, name: str, B: int, V: int) -> Tensor:
        """Rows 0..B-1 of a float32 (rows, V) buffer kept with the cache under `name`, for what a step writes anew
        every time (the fused step's logits, the CPU beam step's log-probs): a step then allocates nothing. A fresh
        array each step of an OPUS-MT-size model was 7.4 MB at 32 rows, and glibc either mapped it anew every step
        or, once its mmap threshold had risen past it, kept it in a heap that only grew. The buffer is made
        unfilled, so pages rows never reach are never touched; its contents last until the next step's."""
        buf = self._scratch.get(name)
        if buf is None or buf.shape[1] != V:
            buf = self._scratch[name] = torch.empty(self.rows, V, device=self.pos.device)
        return buf[:B]

    def beam_moves(self, k: int) -> tuple[int, np.ndarray]:
        """For `beam_host.move_beams`: the self-attention length in use (T, positions below it are ever read) and the
        transit array for k rows' K/V below it, every layer."""
        L, _, _, H, _, Dh = self.self_kv.shape
        T = min(self.t_hi + 1, self.max_tgt)
        return T, self.transit(k * L * 2 * H * T * Dh)

    def transit(self, elements: int) -> np.ndarray:
        """A flat float32 host array, at least `elements` long, kept with the cache: where K/V rows in transit go
        (`copy_rows`, `beam_host.move_beams`), so a beam step allocates nothing. Made anew, unfilled, at twice the
        size when too small, so only the pages a move reaches are ever touched."""
        if self._transit.size < elements:
            self._transit = np.empty(max(elements, 2 * self._transit.size), np.float32)
        return self._transit

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.self_kv, self.cross_kv))

    def admit(self, start: int, cross_kv: Tensor, src_mask: Tensor, repeat: int = 1) -> None:
        """Fill rows start..start+B-1 with fresh sequences: cross K/V (L, 2, B / repeat, H, S, Dh), each source's
        written into `repeat` rows one after another (a beam search's beams: one copy, not a copy expanded first),
        and the source mask of every row (B, S).

        Rows 0..start-1 are the active rows already decoding.
        """
        B, S = src_mask.shape
        if self.max_src < S:
            raise ValueError(f"source of {S} tokens exceeds the cache's max_src {self.max_src}")
        if cross_kv.shape[2] * repeat != B:
            raise ValueError(f"{cross_kv.shape[2]} sources x {repeat} rows for {B} rows")
        end = start + B
        if repeat == 1:
            self.cross_kv[:, :, start:end, :, :S] = cross_kv
        else:
            L, two, _, H, S_max, Dh = self.cross_kv.shape
            rows = self.cross_kv[:, :, start:end].view(L, two, B // repeat, repeat, H, S_max, Dh)  # one row per beam
            rows[..., :S, :] = cross_kv.unsqueeze(3)
        self.src_mask[start:end] = False
        self.src_mask[start:end, :S] = src_mask
        self.pos[start:end] = 0
        self.set_active(end)

    def masks(self, B: int) -> tuple[Tensor | None, Tensor | None]:
        """Self- and cross-attention masks (B, 1, 1, T|S) of rows 0..B-1, True = keep; None where none is needed."""
        T = self.t_hi + 1
        self_mask = None if self.t_lo == self.t_hi else (self.t_ids[:T] <= self.pos[:B, None])[:, None, None, :]
        cross_mask = None if self.s_lo == self.s_hi else self.src_mask[:B, None, None, : self.s_hi]
        return self_mask, cross_mask

    def write(self, layer: int, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new token's K/V (B, 2, H, Dh) at each row's position; return K, V (B, H, T, Dh) of the rows."""
        B = kv.shape[0]
        buf = self.self_kv[layer]  # (2, R, H, T, Dh)
        if self.t_lo == self.t_hi:  # every row at the same position: a plain strided copy
            buf[:, :B, :, self.t_hi] = kv.transpose(0, 1)
        else:
            buf[:, self.row_ids[:B], :, self.pos[:B]] = kv
        T = self.t_hi + 1
        return buf[0, :B, :, :T], buf[1, :B, :, :T]

    def write_at(self, layer: int, kv: Tensor, pos: Tensor) -> tuple[Tensor, Tensor]:
        """`write` with shapes fixed by the buffers, for CUDA graphs: kv (B, 2, H, Dh) stored at pos (B,) on the
        device; returns K, V (B, H, max_tgt, Dh), to be read with `fixed_masks`."""
        B = kv.shape[0]
        buf = self.self_kv[layer]
        buf[:, self.row_ids[:B], :, pos] = kv
        return buf[0, :B], buf[1, :B]

    def fixed_masks(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        """Masks (B, 1, 1, max_tgt | max_src) over whole buffers for rows 0..B-1 at positions pos (B,)."""
        B = pos.shape[0]
        return (self.t_ids <= pos[:, None])[:, None, None, :], self.src_mask[:B, None, None, :]

    def cross(self, layer: int, B: int, whole: bool = False) -> tuple[Tensor, Tensor]:
        """Cross-attention K, V (B, H, S, Dh) of rows 0..B-1 over the longest active source (whole: over the
        whole buffer, S = max_src, for the fixed-shape step)."""
        buf = self.cross_kv[layer]
        S = self.max_src if whole else self.s_hi
        return buf[0, :B, :, :S], buf[1, :B, :, :S]

    def advance(self, B: int, on_device: bool = True, steps: int = 1) -> None:
        """Rows 0..B-1 each took `steps` tokens; on_device=False when the step already moved `pos`."""
        if on_device:
            self.pos[:B] += steps
        self.t_lo += steps
        self.t_hi += steps

    def copy_rows(self, src: Tensor, dst: Tensor, cross: bool = True) -> None:
        """Row dst[i] becomes a copy of row src[i] (beam reordering, packing). Overlap is safe."""
        T, S = min(self.t_hi + 1, self.max_tgt), self.s_hi  # nothing beyond these is ever read
        bufs = [(self.self_kv, T)] + ([(self.cross_kv, S)] if cross else [])
        if self.pos.device.type == "cpu" and all(buf.dtype in HOST_COPY for buf, _ in bufs):
            self._copy_rows_host(bufs, src.numpy(), dst.numpy(), cross)
            return
        for buf, n in bufs:
            if buf.device.type != "cpu":  # one gather and one scatter: on a GPU each launch costs more than the copy
                rows = buf[:, :, :, :, :n]
                rows.index_copy_(2, dst, rows.index_select(2, src))
                continue
            for layer in buf[:, :, :, :, :n]:
                for kv in layer:  # (R, H, n, Dh): a few MB at a time stays in cache, 4x faster than all at once
                    kv.index_copy_(0, dst, kv.index_select(0, src))
        if cross:
            self.src_mask[dst] = self.src_mask[src]
        self.pos[dst] = self.pos[src]

    def _copy_rows_host(self, bufs: list[tuple[Tensor, int]], src: np.ndarray, dst: np.ndarray, cross: bool) -> None:
        """`copy_rows` on the CPU: `beam_host.move_rows`, which copies a row directly unless its source is written
        too and moves the others through `transit`; numpy's fancy indexing without numba. (torch's index_select and
        index_copy_ cost 10-25 us a call where numpy's cost a few: a beam-4 reorder of the shipped model took 27-35
        against 103 us, ad hoc. numpy's made a new array of every moved row each time, 9.5 MB a layer and step for
        beam 4 at 32 sentences of an OPUS-MT model.)"""
        stay = src == dst  # a beam that goes on from itself: nothing to copy
        if stay.any():
            src, dst = src[~stay], dst[~stay]
        if move_rows is not None and self.self_kv.dtype == torch.float32:  # (numba has no float16 arithmetic)
            through = np.isin(src, dst)  # rows whose source is written too: read aside before any is written
            _, _, _, H, _, Dh = self.self_kv.shape
            transit = self.transit(int(through.sum()) * H * max(n for _, n in bufs) * Dh)
            for buf, n in bufs:
                move_rows(buf.numpy(), n, src, dst, through, transit)
        else:
            for buf, n in bufs:
                for layer in buf.numpy()[:, :, :, :, :n]:
                    for kv in layer:  # (R, H, n, Dh): the right side is a copy first, so overlapping rows are safe
                        kv[dst] = kv[src]
        if cross:
            mask = self.src_mask.numpy()
            mask[dst] = mask[src]
        pos = self.pos.numpy()
        pos[dst] = pos[src]

    def set_active(self, n: int) -> None:
        """Rows 0..n-1 are the active ones: recompute the host-side bounds (one device sync, when rows come or go)."""
        if n == 0:
            self.t_lo = self.t_hi = self.s_lo = self.s_hi = 0
            return
        pos, lengths = torch.aminmax(self.pos[:n]), torch.aminmax(self.src_mask[:n].sum(1))  # right-padded sources
        self.t_lo, self.t_hi, self.s_lo, self.s_hi = torch.stack([*pos, *lengths]).tolist()  # one transfer
