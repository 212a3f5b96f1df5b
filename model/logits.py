"""Logits processing, vectorised over rows that each carry their own settings.

Every function takes logits (B, V) for B rows and per-row setting tensors of shape (B,), and works in place
or returns a new tensor; none loops over rows in Python.
"""

from __future__ import annotations

import torch
from torch import Tensor

NEG_INF = float("-inf")
_MASK32 = 0xFFFFFFFF


def forbid_early_eos(logits: Tensor, n_gen: Tensor, min_new: Tensor, eos_id: int) -> None:
    """End-of-sentence is impossible for rows that have generated fewer than min_new tokens."""
    logits[:, eos_id].masked_fill_(n_gen < min_new, NEG_INF)


def repetition_penalty(logits: Tensor, history: Tensor, n_gen: Tensor, penalty: Tensor) -> None:
    """CTRL-style penalty on every token already generated: positive logits / p, negative logits * p."""
    L = history.shape[1]
    seen = torch.arange(L, device=history.device) < n_gen[:, None]  # (B, L)
    ids = torch.where(seen, history, history.new_zeros(()))  # unseen slots point at token 0 ...
    picked = logits.gather(1, ids)  # (B, L)
    p = penalty[:, None]
    scored = torch.where(picked > 0, picked / p, picked * p)
    scored = torch.where(seen, scored, picked)  # ... and write token 0's own value back unchanged
    logits.scatter_(1, ids, scored)


def ban_repeated_ngrams(logits: Tensor, history: Tensor, n_gen: Tensor, n: int) -> None:
    """Forbid any token that would complete an n-gram already present in the row's history."""
    B, L = history.shape
    if n < 1 or n > L:
        return
    if n == 1:
        rows, cols = (torch.arange(L, device=history.device) < n_gen[:, None]).nonzero(as_tuple=True)
        logits[rows, history[rows, cols]] = NEG_INF
        return
    windows = history.unfold(1, n, 1)  # (B, W, n), W = L - n + 1
    start = torch.arange(windows.shape[1], device=history.device)
    complete = start + n <= n_gen[:, None]  # (B, W) windows wholly inside the generated prefix
    tail_idx = (n_gen[:, None] - (n - 1) + torch.arange(n - 1, device=history.device)).clamp(min=0)
    tail = history.gather(1, tail_idx)  # (B, n-1) the last n-1 generated tokens
    match = (windows[:, :, :-1] == tail[:, None, :]).all(-1) & complete & (n_gen[:, None] >= n - 1)
    banned = torch.where(match, windows[:, :, -1], torch.full_like(windows[:, :, -1], -1))
    rows, cols = (banned >= 0).nonzero(as_tuple=True)
    logits[rows, banned[rows, cols]] = NEG_INF


def top_k_top_p(logits: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Keep per row the top_k most likely tokens (0 = all) within top_p of probability mass (1 = all)."""
    V = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
    rank = torch.arange(V, device=logits.device)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, V))
    drop = rank >= k[:, None]
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs  # probability of the better tokens
    drop |= mass_before >= top_p[:, None]
    drop[:, 0] = False  # the best token always stays
    sorted_logits = sorted_logits.masked_fill(drop, NEG_INF)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def hashed_uniform(seed: Tensor, step: Tensor, V: int) -> Tensor:
    """Counter-based uniform noise (B, V) in (0, 1): a function of (seed, step, token) only.

    A row's samples therefore never depend on which other rows share its batch.
    """
    token = torch.arange(V, device=seed.device, dtype=torch.long)
    x = (seed[:, None] * 0x9E3779B1 + step[:, None] * 0x85EBCA77 + token * 0xC2B2AE3D) & _MASK32
    for mult in (0x7FEB352D, 0x846CA68B, 0x7FEB352D):  # lowbias32-style mixing rounds
        x = ((x ^ (x >> 16)) * mult) & _MASK32
        x = x ^ (x >> 15)
    return (x.double() + 0.5) / 2.0**32


def sample(logprobs: Tensor, seed: Tensor, step: Tensor) -> Tensor:
    """Draw one token per row from softmax(logprobs) by the Gumbel-max trick with hashed noise."""
    u = hashed_uniform(seed, step, logprobs.shape[1])
    gumbel = -torch.log(-torch.log(u))
    return (logprobs.double() + gumbel).argmax(-1)


ONE_THREAD_MAX = 1 << 17  # `log_softmax`: up to this many logits, on the calling thread alone


def log_softmax(logits: Tensor, out: Tensor | None = None) -> Tensor:
    """torch's log-softmax of a step's logits (the general way's numbers, bit for bit), on this thread alone up to
    `ONE_THREAD_MAX` logits. A parallel region leaves torch's OpenMP threads spinning (GOMP_SPINCOUNT,
    model/runtime.py), and on two cores the spinning thread took the core of the fused step's helper thread: the
    shipped model's next step of 4 rows took 0.50 against 0.27 ms (ad hoc). Larger batches keep the threads: their
    step is long, and the log-softmax on one thread would cost more than the spin. `out`: a tensor of the logits'
    shape to write into (`KVCache.scratch`), else a new one."""
    threads = torch.get_num_threads()
    if threads == 1 or logits.numel() > ONE_THREAD_MAX or logits.device.type != "cpu":
        return torch.log_softmax(logits, -1, out=out)
    torch.set_num_threads(1)
    try:
        return torch.log_softmax(logits, -1, out=out)
    finally:
        torch.set_num_threads(threads)
