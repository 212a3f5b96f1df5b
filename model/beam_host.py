"""Beam search's pass over the vocabulary on the CPU, as one compiled loop (numba).

`model.beams.beam_step` calls it for sentences without constraints when the batch lives on the CPU. A step of one
beam-4 sentence of the shipped model spent about 250 us in beam search's own bookkeeping, against 420 us in the
decoder step itself, most of it in two torch top-ks (about 35 us each at 4 x 8,000 log-probs) and numpy's gathers
around them: one call here.
"""

from __future__ import annotations

from numba import njit


@njit(nogil=True, cache=True)
def best_continuations(logprobs, rows, score, top, beam, token):  # type: ignore[no-untyped-def]  # pragma: no cover
    """For each sentence j, whose k beams are the cache rows rows[j] (m, k): its n = top.shape[1] best continuations
    over every beam and token, best first: the running score of the beam's row plus the token's log-prob (float32,
    as numpy adds them) into top[j], the beam's index into beam[j] and the token into token[j]. Of equal scores the
    earlier beam, then the lower token, comes first.

    The same n as the 2k best tokens of each beam and then the 2k best of those k x 2k (the way `beam_step` takes
    on the GPU), in one pass over the log-probs."""
    m, k = rows.shape
    n = top.shape[1]
    V = logprobs.shape[1]
    for j in range(m):
        filled = 0
        for b in range(k):
            r = rows[j, b]
            s = score[r]
            row = logprobs[r]
            for v in range(V):
                x = s + row[v]
                if filled == n and not x > top[j, n - 1]:
                    continue
                i = filled if filled < n else n - 1
                while i > 0 and x > top[j, i - 1]:
                    top[j, i], beam[j, i], token[j, i] = top[j, i - 1], beam[j, i - 1], token[j, i - 1]
                    i -= 1
                top[j, i], beam[j, i], token[j, i] = x, b, v
                if filled < n:
                    filled += 1

