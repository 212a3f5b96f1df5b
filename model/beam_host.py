"""Beam search's pass over the vocabulary on the CPU, as one compiled loop (numba).

`model.beams.beam_step` calls it for sentences without constraints when the batch lives on the CPU. A step of one
beam-4 sentence of the shipped model spent about 250 us in beam search's own bookkeeping, against 420 us in the
decoder step itself, most of it in two torch top-ks (about 35 us each at 4 x 8,000 log-probs) and numpy's gathers
around them: one call here.
"""

from __future__ import annotations

import numpy as np

from model import native

_AHEAD = native.extension(__name__)  # kernels compiled ahead for this machine (model/native.py), else numba's JIT
if _AHEAD is None:
    from numba import njit
else:
    njit = _AHEAD.njit  # type: ignore[assignment]


SKIP = 64  # log-probs tested a block at a time against the n-th best so far (`best_continuations`)


@njit(nogil=True, cache=True)
def best_continuations(logprobs, rows, score, top, beam, token):  # type: ignore[no-untyped-def]  # pragma: no cover
    """For each sentence j, whose k beams are the cache rows rows[j] (m, k): its n = top.shape[1] best continuations
    over every beam and token, best first: the running score of the beam's row plus the token's log-prob (float32,
    as numpy adds them) into top[j], the beam's index into beam[j] and the token into token[j]. Of equal scores the
    earlier beam, then the lower token, comes first.

    The same n as the 2k best tokens of each beam and then the 2k best of those k x 2k (the way `beam_step` takes
    on the GPU), in one pass over the log-probs. Once n are held, a block of SKIP log-probs none of which beats the
    n-th best is passed over after one count that vectorises (the same comparisons as one by one: 4 times faster at
    32 beam-4 sentences of 8,000 pieces, 99 us against 403, ad hoc; the same choices)."""
    m, k = rows.shape
    n = top.shape[1]
    V = logprobs.shape[1]
    for j in range(m):
        filled = 0
        for b in range(k):
            r = rows[j, b]
            s = score[r]
            row = logprobs[r]
            v = 0
            while v < V:
                if filled == n and v + SKIP <= V:
                    block, t = row[v : v + SKIP], top[j, n - 1]
                    above = np.int32(0)
                    for i in range(SKIP):
                        above += np.int32(s + block[i] > t)
                    if above == 0:
                        v += SKIP
                        continue
                end = min(v + SKIP, V)
                for u in range(v, end):
                    x = s + row[u]
                    if filled == n and not x > top[j, n - 1]:
                        continue
                    i = filled if filled < n else n - 1
                    while i > 0 and x > top[j, i - 1]:
                        top[j, i], beam[j, i], token[j, i] = top[j, i - 1], beam[j, i - 1], token[j, i - 1]
                        i -= 1
                    top[j, i], beam[j, i], token[j, i] = x, b, u
                    if filled < n:
                        filled += 1
                v = end


@njit(nogil=True, cache=True)
def choose_beams(logprobs, rows, score, eos, top, beam, token, picked, ended):  # type: ignore[no-untyped-def]  # pragma: no cover
    """`best_continuations`, then each sentence's choice among its candidates, best first: one that ends the
    sentence (token eos) and ranks within the first k ends a hypothesis; the first k others go on.

    picked (m, k, 3) float64: beam, token and score of each continuation that goes on, in order (float64 holds the
    float32 scores and every id exactly, so that one `tolist` brings them all up); ended (m, k + 1, 2) float64:
    ended[j, 0, 0] the number of hypotheses sentence j ended, then beam and score of each. Returns the fewest
    continuations any sentence found (k, unless its candidates ran out)."""
    best_continuations(logprobs, rows, score, top, beam, token)
    m, k = rows.shape
    n = top.shape[1]
    fewest = k
    for j in range(m):
        got = 0
        done = 0
        for i in range(n):
            if token[j, i] == eos:
                if i < k:
                    ended[j, done + 1, 0] = beam[j, i]
                    ended[j, done + 1, 1] = top[j, i]
                    done += 1
                continue
            picked[j, got, 0] = beam[j, i]
            picked[j, got, 1] = token[j, i]
            picked[j, got, 2] = top[j, i]
            got += 1
            if got == k:
                break
        ended[j, 0, 0] = done
        fewest = min(fewest, got)
    return fewest


@njit(nogil=True, cache=True)
def _copy_kv(src, dst, T):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """dst[h, t] = src[h, t] for positions t below T of (H, T_max, Dh) blocks, a row of Dh at a time."""
    for h in range(src.shape[0]):
        for t in range(T):
            for d in range(src.shape[2]):
                dst[h, t, d] = src[h, t, d]


@njit(nogil=True, cache=True)
def move_rows(kv, n, src, dst, through, transit):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Row dst[i] of kv (L, 2, R, H, N, Dh) takes row src[i]'s positions below n, in every layer, K and V. Rows
    whose source is also written (through[i]) are read into transit (flat, at least sum(through) * H * n * Dh long)
    first, a layer's K or V at a time; the others are copied directly, since nothing writes their sources."""
    L, _, _, H, _, Dh = kv.shape
    m = 0
    for i in range(src.shape[0]):
        m += through[i]
    aside = transit[:m * H * n * Dh].reshape((m, H, n, Dh))
    for layer in range(L):
        for c in range(2):
            block = kv[layer, c]
            k = 0
            for i in range(src.shape[0]):
                if through[i]:
                    _copy_kv(block[src[i]], aside[k], n)
                    k += 1
            k = 0
            for i in range(src.shape[0]):
                if through[i]:
                    _copy_kv(aside[k], block[dst[i]], n)
                    k += 1
                else:
                    _copy_kv(block[src[i]], block[dst[i]], n)


@njit(nogil=True, cache=True)
def move_beams(rows, picked, tokens, score, self_kv, T, history, pos, transit):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Each sentence's rows take the continuations `choose_beams` picked: row rows[j, b] continues the beam
    rows[j, picked[j, b, 0]] (its self-attention K/V of positions below T (self_kv (L, 2, R, H, T_max, Dh)), its
    history and position, when it is another row) with token picked[j, b, 1] (into tokens) and running score
    picked[j, b, 2] (into score). A sentence's rows are read before any of them is written, into transit (flat, at
    least k * L * 2 * H * T * Dh long)."""
    m, k = rows.shape
    L, _, _, H, _, Dh = self_kv.shape
    kv = transit[:k * L * 2 * H * T * Dh].reshape((k, L, 2, H, T, Dh))
    hist = np.empty((k, history.shape[1]), history.dtype)
    at = np.empty(k, pos.dtype)
    for j in range(m):
        for b in range(k):  # the rows this sentence's moves read, copied aside first
            src = np.int64(picked[j, b, 0])
            if src == b:
                continue
            r = rows[j, src]
            for layer in range(L):
                for c in range(2):
                    _copy_kv(self_kv[layer, c, r], kv[src, layer, c], T)
            for t in range(history.shape[1]):  # element by element: a slice assignment compiles an error message
                hist[src, t] = history[r, t]
            at[src] = pos[r]
        for b in range(k):
            src = np.int64(picked[j, b, 0])
            r = rows[j, b]
            if src != b:
                for layer in range(L):
                    for c in range(2):
                        _copy_kv(kv[src, layer, c], self_kv[layer, c, r], T)
                for t in range(history.shape[1]):
                    history[r, t] = hist[src, t]
                pos[r] = at[src]
            tokens[r] = np.int64(picked[j, b, 1])
            score[r] = np.float32(picked[j, b, 2])


@njit(nogil=True, cache=True)
def advance_beams(logprobs, rows, score, eos, top, beam, token, picked, ended,  # type: ignore[no-untyped-def]
                  self_kv, T, history, pos, n_gen, last, transit):  # pragma: no cover - compiled
    """A whole beam-search step after the log-probs, for batches whose every row is a beam of the sentences `rows`
    (m, k): `choose_beams`, `move_beams` with the tokens written into `last`, then each row's token recorded as
    `DecodeBatch.record_host` does (history, n_gen). False, with nothing moved or recorded, where a sentence found
    fewer than k continuations."""
    m, k = rows.shape
    if choose_beams(logprobs, rows, score, eos, top, beam, token, picked, ended) < k:
        return False
    move_beams(rows, picked, last, score, self_kv, T, history, pos, transit)
    at_most = history.shape[1] - 1
    for j in range(m):
        for b in range(k):
            r = rows[j, b]
            history[r, min(n_gen[r], at_most)] = last[r]
            n_gen[r] += 1
    return True
