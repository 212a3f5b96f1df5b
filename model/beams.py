"""Beam search and constrained choices: what a step chooses beyond the argmax.

`beam_step` advances every beam-search sequence (the 2k best continuations, k kept, rows reordered), keeping each
sentence's finished hypotheses; `force_constraints` lets greedy rows with unmet glossary terms take a term's token
(model.constraints). `model.search.step` calls them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from model import logits as lp
from model.constraints import select_beams
from model.decode import DecodeBatch, Sequence
from model.events import Event, Hypothesis

try:  # numba; without it (the GPU script's bare machine) the CPU takes torch's top-ks as the GPU does
    from model.beam_host import advance_beams, best_continuations, choose_beams, move_beams
    from model.kernels import ban_tokens
except (ImportError, RuntimeError):  # pragma: no cover - RuntimeError: numba finds no writable cache
    advance_beams = ban_tokens = best_continuations = choose_beams = move_beams = None  # type: ignore[assignment]

Collected = tuple[list[Event], list[Sequence]]  # a step's events and the sequences that finished

# From this many logits on, `top_k` goes through chunk maxima; below, torch's topk is as fast or faster
# (bench/levers.py, 1 and 2 threads, k = 8: 4 x 8,000 logits 53 against 145-224 us; 32 x 8,000 even, 0.85-1.23x;
# 32 x 16,000 and up, the chunks 1.3-3.5x faster).
CHUNKED_TOP_K_MIN = 1 << 18
# Up to this many log-probs a step, beam search on the CPU takes its candidates in one compiled pass on one thread
# (model/beam_host.py); beyond, torch's top-ks on every thread are faster: 128 x 58,101 log-probs took 4.9 ms in
# the pass against 2.0 ms for `top_k` alone on two threads, where 128 x 8,000 took 0.7 against 1.0 (ad hoc).
COMPILED_MAX = 1 << 21
# `device_beam_step` on the CPU too (tests compare it there with the CPU's ways)
DEVICE_WAY_ON_CPU = False


def top_k(x: Tensor, k: int, chunk: int = 256, min_size: int | None = None) -> tuple[Tensor, Tensor]:
    """x.topk(k, dim=-1) for rows (B, V); from min_size logits on through chunk maxima, 2 to 3 times faster on the
    CPU at V = 58k. min_size None: CHUNKED_TOP_K_MIN on the CPU, never on a GPU, where torch's top-k is one kernel
    and the chunks' way seven.

    The k best of a row lie in the k chunks with the best maxima (and the tail after the last whole chunk), so
    one max pass over the row and two narrow top-ks replace a partial sort of every row.
    """
    B, V = x.shape
    n_chunks = V // chunk
    whole = n_chunks * chunk
    if min_size is None:
        min_size = CHUNKED_TOP_K_MIN if x.device.type == "cpu" else x.numel() + 1
    if n_chunks <= k or min_size > x.numel():
        return x.topk(k, dim=-1)
    body = x[:, :whole].view(B, n_chunks, chunk)
    best = body.amax(-1).topk(k, dim=-1).indices  # (B, k) chunks
    cand = torch.cat([body.gather(1, best[..., None].expand(B, k, chunk)).view(B, k * chunk), x[:, whole:]], 1)
    values, pos = cand.topk(k, dim=-1)
    in_body = best.gather(1, (pos // chunk).clamp(max=k - 1)) * chunk + pos % chunk
    return values, torch.where(pos < k * chunk, in_body, pos - k * chunk + whole)


def short_beam_step(batch: DecodeBatch, seqs: list[Sequence]) -> bool:
    """The whole step of a batch of plain beam searches (`Sequence.plain_beams`) of one width: off the CPU
    `device_beam_step`; on the CPU, where the fused step takes it, the step, the settings, the log-softmax, the
    choice, the rows' moves and the record in two compiled calls and one torch call around the fused step's; the
    general way (`DecodeBatch.forward`, `model.search._log_probs`, `beam_step`, `DecodeBatch.record`) computes the
    same numbers through a dozen more calls and checks, which cost a beam-4 sentence of the shipped model about as
    much as the fused step itself. False, with nothing done, where it does not apply; True once the step is taken
    and every sequence brought up to date (its hypotheses, beams and scores; `model.search._collect` then finishes
    the step).
    """
    k = seqs[0].beam
    if not all(s.plain_beams and s.beam == k for s in seqs):
        return False
    if batch.net.device.type != "cpu" or DEVICE_WAY_ON_CPU:
        return device_beam_step(batch, seqs)
    if advance_beams is None or batch.cache.self_kv.dtype != torch.float32:
        return False
    n, V = batch.n, batch.cfg.tgt_vocab_size
    if n * V > COMPILED_MAX:
        return False
    logits = batch.fused_logits()
    if logits is None:
        return False
    _, n_gen, _, min_new = batch.state.host_views()
    ban_tokens(logits.numpy(), batch.banned_host, batch.cfg.eos_id, n_gen[:n], min_new[:n])
    _HostChoice(batch, seqs)(logits)
    return True


class _HostChoice:
    """A CPU beam step's part after its logits, banned tokens set: the log-softmax, then the choice, the rows' moves
    and the record in one compiled call (`advance_beams`), and each sentence's hypotheses, beams and scores brought
    up to date. Its arrays are made once, for a run of steps of the same sentences (`beam_steps`)."""

    def __init__(self, batch: DecodeBatch, seqs: list[Sequence]) -> None:
        k, n, V = seqs[0].beam, batch.n, batch.cfg.tgt_vocab_size
        m, c = len(seqs), min(2 * k, k * V)
        self.batch, self.seqs, self.k = batch, seqs, k
        self.rows = np.array([s.rows for s in seqs], np.int64)  # (m, k)
        self.top, self.beam, self.token = (np.empty((m, c), np.float32), np.empty((m, c), np.int64),
                                           np.empty((m, c), np.int64))
        self.chosen, self.ended = np.empty((m, k, 3)), np.empty((m, k + 1, 2))
        self.logprobs = batch.cache.scratch("logprobs", n, V)  # (`DecodeBatch.buffer` on the CPU)

    def __call__(self, logits: Tensor) -> bool:
        """The step after these logits (n, V); True where it took the general way (`beam_step`: a vocabulary too
        small for k continuations)."""
        batch, seqs, st = self.batch, self.seqs, self.batch.state
        history, n_gen, last, _ = st.host_views()
        pos, _, self_kv, _ = batch.cache.host_views()
        logprobs = lp.log_softmax(logits, out=self.logprobs)
        T, transit = batch.cache.beam_moves(self.k)
        if not advance_beams(logprobs.numpy(), self.rows, st.score.numpy(), batch.cfg.eos_id, self.top, self.beam,
                             self.token, self.chosen, self.ended, self_kv, T, history, pos, n_gen, last, transit):
            tokens = logprobs.new_empty(batch.n, dtype=torch.long)
            beam_step(batch, seqs, logprobs, tokens, None)
            batch.record(tokens)
            return True
        for seq, chosen_j, ended_j in zip(seqs, self.chosen.tolist(), self.ended.tolist(), strict=True):
            _take(seq, chosen_j, ended_j, None)
        return False


def beam_steps(batch: DecodeBatch, seqs: list[Sequence], most: int,
               collect: Callable[[list[Sequence]], Collected]) -> tuple[list[Event], int] | None:
    """Up to `most` steps of a batch of plain beam searches of one width on the CPU, until a sentence finishes: each
    step `short_beam_step`'s, then `collect` (the search's end of a step: each sentence's step counted, its
    hypotheses if it finished). The decoder steps after the first are posted from compiled code with the banned
    tokens set in the same call (`FusedStep.banned_step`), the helper threads held awake between them; the Python
    around a step is then the log-softmax, the choice's call and each sentence's bookkeeping. Returns the events and
    the steps taken, the finished sentences removed; None, with nothing done, where `short_beam_step` would not
    take the step."""
    k, fused = seqs[0].beam, batch.net.fused
    if (not all(s.plain_beams and s.beam == k for s in seqs) or batch.net.device.type != "cpu" or DEVICE_WAY_ON_CPU
            or advance_beams is None or batch.cache.self_kv.dtype != torch.float32 or fused is None):
        return None
    n, V = batch.n, batch.cfg.tgt_vocab_size
    # Only steps cut in parts (or on one thread) with the log-softmax on this thread: with a batch's tail in runs of
    # rows, or the log-softmax's second OpenMP thread meeting the helper held awake, beam 4 at batch 32 read
    # 0.95-0.96x the step-by-step way (bench/ab_engine.py, ad hoc; with this bound 0.99-1.01x)
    if n * V > min(COMPILED_MAX, lp.ONE_THREAD_MAX) or n > fused.parts_max_rows or torch.get_num_threads() == 1:
        return None  # (on one thread, steps one by one: `kernels.banned_step` posts its steps to helper threads)
    logits = batch.fused_logits()  # the first step as the fused step takes any (it wakes sleeping helpers)
    if logits is None:
        return None
    st, eos = batch.state, batch.cfg.eos_id
    _, n_gen, _, min_new = st.host_views()
    host, banned = logits.numpy(), batch.banned_host
    ban_tokens(host, banned, eos, n_gen[:n], min_new[:n])
    choose, ids = _HostChoice(batch, seqs), np.empty(n, np.int64)
    events: list[Event] = []
    taken = 0
    with fused.posting(n) as (_, posted):
        while True:
            general = choose(logits)
            taken += 1
            more, done = collect(seqs)
            events += more
            if general or done or taken == most:
                break
            fused.banned_step(ids, batch.cache, host, banned, eos, *st.host_longs(), posted)
    if done:
        batch.remove(done)
    return events, taken


def device_beam_step(batch: DecodeBatch, seqs: list[Sequence]) -> bool:
    """`short_beam_step` off the CPU: plain beam searches of one width chosen, moved and recorded on the device,
    with one transfer to the host per step (the k continuations and the hypotheses that end, for every sentence).

    The general way (`beam_step`) crosses to the host and back in the middle of the step and decides in Python,
    sentence by sentence; on a GPU, where the step itself is a replayed graph of a fraction of a millisecond, those
    crossings and launches were most of a beam step's time (beam 4 at 0.44-0.71x CTranslate2 float16 on an H100).
    The numbers are the general way's: the same top-ks over the same log-probs, the first k candidates that do
    not end the sentence go on (in rank order), and those that end it among the first k become hypotheses.
    """
    k, m = seqs[0].beam, len(seqs)
    V, eos, st = batch.cfg.tgt_vocab_size, batch.cfg.eos_id, batch.state
    if 2 * k > V:  # fewer than k continuations that do not end could come out of 2k candidates
        return False
    logits, _ = batch.forward(choose=True)  # (n, V) float32, the settings applied
    logprobs = logits.log_softmax(-1)  # every row is a beam's: `_log_probs` normalises them all
    c = 2 * k
    top_logprobs, top_tokens = top_k(logprobs, c)  # (n, 2k) best first, as `beam_step`
    rows = _rows(batch, seqs)  # (m, k)
    cand = (st.score[rows][..., None] + top_logprobs[rows]).view(m, k * c)
    scores, ids = cand.topk(c, dim=-1)  # (m, 2k): rank order
    tokens = top_tokens[rows].view(m, k * c).gather(1, ids)
    beams = ids // c
    ends = tokens == eos  # at most one per beam: at least k candidates go on
    rank = torch.arange(c, 0, -1, device=ids.device)  # earlier ranks weigh more
    first = torch.where(ends, 0, rank).topk(k, dim=-1).indices  # (m, k): the first k that go on, in rank order
    chosen_beam, chosen_token, chosen_score = beams.gather(1, first), tokens.gather(1, first), scores.gather(1, first)
    flat = rows.view(-1)
    batch.reorder(rows.gather(1, chosen_beam).view(-1), flat)  # every row: a copy where a beam stays in place
    step_tokens = torch.empty_like(st.last[: batch.n])
    step_tokens[flat] = chosen_token.view(-1)
    st.score[flat] = chosen_score.view(-1)
    batch.record(step_tokens)
    # one transfer up: float64 holds the float32 scores and every id exactly
    up = torch.stack([chosen_beam, chosen_token, chosen_score, ends[:, :k], beams[:, :k], scores[:, :k]], 1)
    for seq, (beam_j, token_j, score_j, end_j, end_beam_j, end_score_j) in zip(seqs, up.double().tolist(),
                                                                              strict=True):
        for ended, beam, score in zip(end_j, end_beam_j, end_score_j, strict=True):
            if ended:
                _end_beam(seq, int(beam), score)
        _extend(seq, [(int(b), int(t)) for b, t in zip(beam_j, token_j, strict=True)], None)
        seq.scores = score_j
    return True


def _rows(batch: DecodeBatch, seqs: list[Sequence]) -> Tensor:
    """The sequences' rows (m, k) on the device, kept while they stay the same (rows change only when sentences
    join or leave): a tensor made from a list every step would cost a copy that waits for the device."""
    flat = [r for s in seqs for r in s.rows]
    kept = batch.beam_rows
    if kept is None or kept[0] != flat:
        host = torch.tensor(flat, dtype=torch.long)
        if batch.net.device.type == "cuda":
            host = host.pin_memory()
        kept = batch.beam_rows = (flat, host.to(batch.net.device, non_blocking=True).view(len(seqs), -1))
    return kept[1]


def beam_step(batch: DecodeBatch, beams: list[Sequence], logprobs: Tensor, tokens: Tensor,
               sources: list[int] | None) -> None:
    """Advance every beam-search sequence: pick the 2k best continuations, keep k, reorder rows.

    A sequence's 2k best continuations are among the 2k best tokens of each of its beams, so one top-k per
    row is the only pass over the vocabulary. The device and the host meet twice per group of beam sizes: the
    candidates come up in one transfer and the choices go down in one, since on a GPU each crossing waits for
    the device.
    """
    st = batch.state
    device = logprobs.device
    K = min(2 * max(s.beam for s in beams), logprobs.shape[1])
    host = device.type == "cpu"  # numpy there: its small indexing costs a few us where torch's costs 10-25
    compiled = (host and best_continuations is not None and logprobs.dtype == torch.float32
                and logprobs.numel() <= COMPILED_MAX)
    plain = [s for s in beams if s.constraints is None]
    constrained = [s for s in beams if s.constraints is not None]
    moves = _host_moves(batch, max(s.beam for s in beams)) if compiled else None
    if constrained or not compiled:
        top_logprobs, top_tokens = top_k(logprobs, K)  # (n, K) best first
    src_rows: list[int] = []
    dst_rows: list[int] = []
    new_tokens: list[int] = []
    new_scores: list[float] = []
    chosen = _advance_constrained(constrained, st.score, logprobs, top_logprobs, top_tokens, batch.cfg.eos_id,
                                  sources) if constrained else []
    for seq, picks in zip(constrained, chosen, strict=True):
        for b, (beam, token, score) in enumerate(picks):
            src_rows.append(seq.rows[beam])
            dst_rows.append(seq.rows[b])
            new_tokens.append(token)
            new_scores.append(score)
    for k in sorted({s.beam for s in plain}):
        group = [s for s in plain if s.beam == k]
        m, c = len(group), min(2 * k, K)
        if compiled:  # one pass over the log-probs of each sentence's beams (model/beam_host.py)
            n = min(2 * k, k * logprobs.shape[1])
            rows_h = np.array([s.rows for s in group], np.int64)  # (m, k)
            top, beam_h, token_h = np.empty((m, n), np.float32), np.empty((m, n), np.int64), np.empty((m, n), np.int64)
            if moves is not None:  # the choice and the rows' moves compiled too (model/beam_host.py)
                chosen_h, ended_h = np.empty((m, k, 3)), np.empty((m, k + 1, 2))
                if choose_beams(logprobs.numpy(), rows_h, st.score.numpy(), batch.cfg.eos_id, top, beam_h, token_h,
                                chosen_h, ended_h) == k:
                    for seq, chosen_j, ended_j in zip(group, chosen_h.tolist(), ended_h.tolist(), strict=True):
                        _take(seq, chosen_j, ended_j, sources)
                    move_beams(rows_h, chosen_h, tokens.numpy(), st.score.numpy(), *moves)
                    continue
            else:
                best_continuations(logprobs.numpy(), rows_h, st.score.numpy(), top, beam_h, token_h)
            scores, picked = top.tolist(), [list(zip(*pair, strict=True)) for pair in
                                            zip(beam_h.tolist(), token_h.tolist(), strict=True)]
        elif host:
            rows_h = np.array([s.rows for s in group])  # (m, k)
            cand_h = (st.score.numpy()[rows_h][..., None] + top_logprobs.numpy()[rows_h, :c]).reshape(m, k * c)
            top_scores, top_ids = torch.from_numpy(cand_h).topk(2 * k, dim=-1)  # (m, 2k), ties as below
            ids_h = top_ids.numpy()
            toks = np.take_along_axis(top_tokens.numpy()[rows_h, :c].reshape(m, k * c), ids_h, 1).tolist()
            scores, picked = top_scores.tolist(), [[(i // c, t) for i, t in zip(ids, ts, strict=True)]
                                                   for ids, ts in zip(ids_h.tolist(), toks, strict=True)]
        else:
            idx = torch.tensor([s.rows for s in group], device=device)  # (m, k)
            cand = (st.score[idx][..., None] + top_logprobs[idx, :c]).view(m, k * c)
            top_scores, top_ids = cand.topk(2 * k, dim=-1)  # (m, 2k)
            cand_tokens = top_tokens[idx, :c].view(m, k * c).gather(1, top_ids)
            # one transfer (float64 holds the float32 scores and every id exactly)
            scores, ids, toks = torch.stack([top_scores.double(), top_ids.double(), cand_tokens.double()]).tolist()
            picked = [[(int(i) // c, int(t)) for i, t in zip(row_ids, row_toks, strict=True)]
                      for row_ids, row_toks in zip(ids, toks, strict=True)]
        for j, seq in enumerate(group):
            picks = _advance_beams(seq, scores[j], picked[j], batch.cfg.eos_id, sources)
            for b, (beam, token, score) in enumerate(picks):
                src_rows.append(seq.rows[beam])
                dst_rows.append(seq.rows[b])
                new_tokens.append(token)
                new_scores.append(score)
    moved = [(s, d) for s, d in zip(src_rows, dst_rows, strict=True) if s != d]  # a beam kept in place: no copy
    if host:
        if not dst_rows:  # every sentence moved its rows in compiled code
            return
        if moved:
            batch.reorder(torch.tensor([s for s, _ in moved]), torch.tensor([d for _, d in moved]))
        at = np.array(dst_rows)
        tokens.numpy()[at] = new_tokens
        st.score.numpy()[at] = new_scores
        return
    R, M = len(dst_rows), len(moved)
    # one transfer down: rows, tokens, scores and the moves, as float64 (exact for each)
    down = torch.tensor(dst_rows + new_tokens + new_scores + [s for s, _ in moved] + [d for _, d in moved],
                        dtype=torch.float64).to(device)
    ints = down.long()
    if moved:
        batch.reorder(ints[3 * R : 3 * R + M], ints[3 * R + M :])
    rows = ints[:R]
    tokens[rows] = ints[R : 2 * R]
    st.score[rows] = down[2 * R : 3 * R].float()


def _host_moves(batch: DecodeBatch, k: int) -> tuple[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray] | None:
    """What `move_beams` moves a sentence's k beam rows with: the self-attention K/V and the length of it in use,
    the history, the positions (numpy arrays over the batch's memory) and the cache's transit array; None where
    numpy cannot hold the cache."""
    if move_beams is None or batch.cache.self_kv.dtype != torch.float32:
        return None
    pos, _, self_kv, _ = batch.cache.host_views()
    T, transit = batch.cache.beam_moves(k)
    return self_kv, T, batch.state.host_views()[0], pos, transit


def _take(seq: Sequence, chosen: list[list[float]], ended: list[list[float]], sources: list[int] | None) -> None:
    """`_advance_beams` of what `choose_beams` chose: the hypotheses it ended, and the beams that go on."""
    for beam, score in ended[1 : 1 + int(ended[0][0])]:
        _end_beam(seq, int(beam), score)
    _extend(seq, [(int(b), int(t)) for b, t, _ in chosen], sources)
    seq.scores = [s for _, _, s in chosen]


def _advance_beams(seq: Sequence, scores: list[float], cands: list[tuple[int, int]], eos: int,
                   sources: list[int] | None) -> list[tuple[int, int, float]]:
    """Host bookkeeping of one beam sequence: finished hypotheses, and the k beams that go on."""
    k = seq.beam
    picks: list[tuple[int, int, float]] = []
    for rank, (score, (beam, token)) in enumerate(zip(scores, cands, strict=True)):
        if token == eos:
            if rank < k:
                _end_beam(seq, beam, score)
        else:
            picks.append((beam, token, score))
        if len(picks) == k:
            break
    _extend(seq, [(b, t) for b, t, _ in picks], sources)
    seq.scores = [s for _, _, s in picks]
    return picks


def alignment(seq: Sequence, beam: int) -> list[int] | None:
    return list(seq.aligns[beam]) if seq.aligns is not None else None


def _extend(seq: Sequence, picks: list[tuple[int, int]], sources: list[int] | None) -> None:
    """The beams that go on, (beam they continue, token) each: their tokens and, when kept, alignments."""
    if seq.aligns is not None and sources is not None:
        seq.aligns = [seq.aligns[b] + [sources[seq.rows[b]]] for b, _ in picks]
    seq.tokens = [seq.tokens[b] + [t] for b, t in picks]


def force_constraints(batch: DecodeBatch, seqs: list[Sequence], logits: Tensor, tokens: Tensor,
                       sources: list[int] | None) -> None:
    """Greedy and sampled rows with unmet constraints: the model's token, or a constraint's (Constraints.choose).

    Their model tokens, best logits and the logits of the tokens that advance their constraints come up in one
    transfer; the tokens that change go down in one. Rows without constraints are not touched.
    """
    device = logits.device
    eos = batch.cfg.eos_id
    nexts = [s.constraints.next_tokens(s.progress[0]) or [eos] for s in seqs if s.constraints is not None]
    width = max(len(t) for t in nexts)
    rows = torch.tensor([s.rows[0] for s in seqs], device=device)
    cand = torch.tensor([t + [t[0]] * (width - len(t)) for t in nexts], device=device)  # (m, width)
    mine = logits[rows]  # (m, V)
    up = torch.cat([tokens[rows, None].double(), mine.amax(-1, keepdim=True).double(),
                    mine.gather(1, cand).double()], 1).tolist()
    changed: list[tuple[int, int]] = []
    for seq, nxt, (token, best, *starts) in zip(seqs, nexts, up, strict=True):
        c = seq.constraints
        if c is None:
            continue
        scored = dict(zip(nxt, starts, strict=False))
        budget = c.limit(seq.src_len, seq.max_new) - seq.n_gen
        before = seq.aligns[0][-1:] if seq.aligns is not None else []
        looking = [*before, sources[seq.rows[0]]] if sources is not None and before else []
        chosen, seq.progress[0] = c.choose(seq.progress[0], int(token), best, scored, budget, eos, looking)
        if chosen != int(token):
            changed.append((seq.rows[0], chosen))
    if changed:
        down = torch.tensor(changed, dtype=torch.long).to(device)
        tokens[down[:, 0]] = down[:, 1]


def _advance_constrained(seqs: list[Sequence], score: Tensor, logprobs: Tensor, top_logprobs: Tensor,
                         top_tokens: Tensor, eos: int, sources: list[int] | None) -> list[list[tuple[int, int, float]]]:
    """One beam-search step of the sentences with constraints (model.constraints.select_beams): per sentence the same
    picks as `_advance_beams` returns, its hypotheses, beams and progress brought up to date.

    Their rows' running scores, best tokens and the log-probs of the tokens that advance their constraints come up
    in one transfer. The running scores are the device's: at the first step only beam 0 is alive there.
    """
    width = min(2 * max(s.beam for s in seqs), top_tokens.shape[1])
    nexts = [s.constraints.next_tokens(p) or [eos] for s in seqs if s.constraints is not None for p in s.progress]
    extra = max(len(t) for t in nexts)
    rows = torch.tensor([r for s in seqs for r in s.rows], device=logprobs.device)
    cand = torch.tensor([t + [t[0]] * (extra - len(t)) for t in nexts], device=logprobs.device)  # (rows, extra)
    up = torch.cat([score[rows, None].double(), top_tokens[rows, :width].double(), top_logprobs[rows, :width].double(),
                    logprobs[rows[:, None], cand].double()], 1).tolist()
    out = []
    at = 0
    for seq in seqs:
        c, k = seq.constraints, seq.beam
        if c is None:
            raise RuntimeError("a sentence without constraints took the constrained beam path")
        w = min(2 * k, width)
        mine, nxt = up[at:at + k], nexts[at:at + k]
        at += k
        options = [list(zip(map(int, r[1:w + 1]), r[width + 1:width + w + 1], strict=True))
                   + list(zip(n, r[2 * width + 1:], strict=False)) for r, n in zip(mine, nxt, strict=True)]
        budget = c.limit(seq.src_len, seq.max_new) - seq.n_gen - 1
        picks, ended = select_beams(c, k, [r[0] for r in mine], seq.progress, options, eos, budget)
        for beam, total in ended:
            _end_beam(seq, beam, total)
        _extend(seq, [(x.beam, x.token) for x in picks], sources)
        seq.scores = [x.score for x in picks]
        seq.progress = [x.progress for x in picks]
        out.append([(x.beam, x.token, x.score) for x in picks])
    return out


def _end_beam(seq: Sequence, beam: int, score: float) -> None:
    """Beam `beam` of seq ended with end-of-sentence at this running score: a hypothesis, scored by length."""
    hyp = seq.tokens[beam]
    _add_hyp(seq, Hypothesis(list(hyp), score / (len(hyp) + 1) ** seq.config.length_penalty, "eos",
                             alignment(seq, beam)))


def _add_hyp(seq: Sequence, hyp: Hypothesis) -> None:
    seq.hyps.append(hyp)
    seq.hyps.sort(key=lambda h: -h.score)
    del seq.hyps[seq.beam :]


def _beam_done(seq: Sequence) -> bool:
    best: float = max(seq.scores) / seq.n_gen ** seq.config.length_penalty  # transformers' early_stopping=False
    c = seq.constraints
    if c is not None and seq.hyps and not all(c.satisfied(p) for p in seq.progress):
        # Beams that still owe constraints may never end: waiting for k hypotheses ran sentences to their length
        # limit. Stop when no beam still going scores above the best one.
        return seq.hyps[0].score >= best
    if len(seq.hyps) < seq.beam:
        return False
    return seq.hyps[-1].score >= best


def finish_beam(seq: Sequence) -> list[Hypothesis] | None:
    if _beam_done(seq):
        return seq.hyps[: seq.config.num_hypotheses]
    if seq.n_gen < seq.max_new:
        return None
    lpen = seq.config.length_penalty
    c = seq.constraints
    met = [c.satisfied(p) for p in seq.progress] if c is not None else [True] * seq.beam
    if not any(met) and not seq.hyps:  # the length budget could not hold the constraints: better than nothing
        met = [True] * seq.beam
    for beam, (toks, score, ok) in enumerate(zip(seq.tokens, seq.scores, met, strict=True)):
        if not ok:
            continue
        # scored as if closed by an end-of-sentence, like transformers' forced_eos_token_id (Marian)
        _add_hyp(seq, Hypothesis(toks, score / (len(toks) + 1) ** lpen, "length", alignment(seq, beam)))
    return seq.hyps[: seq.config.num_hypotheses]
