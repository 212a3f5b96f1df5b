"""Token-bucketed training batches: sentences of similar length together, a token budget per batch."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import Tensor


def make_batches(
    src: list[np.ndarray], tgt: list[np.ndarray], max_tokens: int, max_len: int, seed: int
) -> list[list[int]]:
    """Index lists whose padded size (rows x longest side) stays under max_tokens; order shuffled by seed."""
    keep = [i for i in range(len(src)) if len(src[i]) <= max_len and len(tgt[i]) + 1 <= max_len]
    rng = random.Random(seed)
    rng.shuffle(keep)  # ties in length are broken randomly
    keep.sort(key=lambda i: (len(src[i]), len(tgt[i])))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in keep:
        size = max(len(src[i]), len(tgt[i]) + 1)
        if current and max(longest, size) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def collate(
    ids: list[int], src: list[np.ndarray], tgt: list[np.ndarray], pad: int, start: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(src (B, S), decoder input (B, T), labels (B, T)) padded with pad; labels end with eos."""
    B = len(ids)
    S = max(len(src[i]) for i in ids)
    T = max(len(tgt[i]) for i in ids)
    s = torch.full((B, S), pad, dtype=torch.long)
    t_in = torch.full((B, T), pad, dtype=torch.long)
    t_out = torch.full((B, T), pad, dtype=torch.long)
    for row, i in enumerate(ids):
        s[row, : len(src[i])] = torch.from_numpy(src[i].astype(np.int64))
        y = torch.from_numpy(tgt[i].astype(np.int64))
        t_out[row, : len(y)] = y
        t_in[row, 0] = start
        t_in[row, 1 : len(y)] = y[:-1]
    return s, t_in, t_out

