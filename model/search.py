"""Greedy decoding, beam search and sampling: plain functions over a DecodeBatch's decoder step.

`step` is the classic loop's body for every active row at once: decode, choose (argmax, a sample, or the beam
advance), reorder the beams' rows, drop what finished. `generate` is the offline engine around it, admitting
sources as rows free up by the same rule as the server (`admissible`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from collections.abc import Sequence as Seq

import numpy as np
import torch
from torch import Tensor

from model import logits as lp
from model.constraints import Term, select_beams
from model.decode import DecodeBatch, Sequence, inference
from model.events import Event, FinishEvent, Hypothesis, SentenceKey, TokenEvent
from model.frozen import FrozenTransformer
from model.generation import GenerationConfig

# From this many logits on, `top_k` goes through chunk maxima; below, torch's topk is as fast or faster
# (bench/levers.py, 1 and 2 threads, k = 8: 4 x 8,000 logits 53 against 145-224 us; 32 x 8,000 even, 0.85-1.23x;
# 32 x 16,000 and up, the chunks 1.3-3.5x faster).
CHUNKED_TOP_K_MIN = 1 << 18


def top_k(x: Tensor, k: int, chunk: int = 256, min_size: int = CHUNKED_TOP_K_MIN) -> tuple[Tensor, Tensor]:
    """x.topk(k, dim=-1) for rows (B, V); from min_size logits on through chunk maxima, 2 to 3 times faster on the
    CPU at V = 58k.

    The k best of a row lie in the k chunks with the best maxima (and the tail after the last whole chunk), so
    one max pass over the row and two narrow top-ks replace a partial sort of every row.
    """
    B, V = x.shape
    n_chunks = V // chunk
    whole = n_chunks * chunk
    if n_chunks <= k or min_size > x.numel():
        return x.topk(k, dim=-1)
    body = x[:, :whole].view(B, n_chunks, chunk)
    best = body.amax(-1).topk(k, dim=-1).indices  # (B, k) chunks
    cand = torch.cat([body.gather(1, best[..., None].expand(B, k, chunk)).view(B, k * chunk), x[:, whole:]], 1)
    values, pos = cand.topk(k, dim=-1)
    in_body = best.gather(1, (pos // chunk).clamp(max=k - 1)) * chunk + pos % chunk
    return values, torch.where(pos < k * chunk, in_body, pos - k * chunk + whole)


# From this many logits on, `argmax` goes through chunk maxima; below, its extra calls cost more than they save
# (crossover between 96k and 116k logits on the 2-core AVX2 EPYC, one thread).
CHUNKED_ARGMAX_MIN = 100_000


def argmax(x: Tensor, chunk: int = 256) -> Tensor:
    """x.argmax(-1) for rows (B, V), first index on ties.

    torch's argmax over a row is not vectorised on the CPU (about 1 ns a logit here: 1.85 ms for 32 rows of 58k).
    There numpy's, which is, runs instead: 9-12 times faster (bench/levers.py). Elsewhere, from CHUNKED_ARGMAX_MIN
    logits, through chunk maxima: the first chunk that holds a row's maximum holds its first argmax.
    """
    B, V = x.shape
    n = V // chunk
    if x.device.type == "cpu" and x.is_contiguous() and x.dtype == torch.float32:  # numpy's argmax is vectorised
        return torch.from_numpy(x.numpy().argmax(-1))
    if x.numel() < CHUNKED_ARGMAX_MIN or n < 2:
        return x.argmax(-1)
    whole = n * chunk
    body = x[:, :whole].view(B, n, chunk)
    maxima = body.amax(-1)  # (B, n)
    if whole < V:  # the tail after the last whole chunk is one more candidate "chunk"
        maxima = torch.cat([maxima, x[:, whole:].amax(-1, keepdim=True)], 1)
    c = maxima.argmax(-1)  # (B,) the first chunk holding the row's maximum
    in_body = c.clamp(max=n - 1)
    inside = body.gather(1, in_body[:, None, None].expand(B, 1, chunk))[:, 0].argmax(-1)  # (B,)
    if whole == V:
        return in_body * chunk + inside
    tail = x[:, whole:].argmax(-1) + whole
    return torch.where(c < n, in_body * chunk + inside, tail)


@inference
def step(batch: DecodeBatch) -> list[Event]:
    """One decoder step for every active row; returns the tokens and the sequences that finished (which leave)."""
    if batch.n == 0:
        return []
    n, st = batch.n, batch.state
    seqs = list(batch.seqs.values())
    batch.plain = False  # forward() says otherwise when it takes the short way
    logits, align = batch.forward()  # (n, V), (n,) or None
    if batch.plain:  # every row plain greedy: the argmax is all there is to choose
        chosen = logits.numpy().argmax(1)  # the first index on ties, as argmax()
        batch.record_host(chosen)
        token_ids, chosen_logprobs = chosen.tolist(), [math.nan] * n
        scored = [s.rows[0] for s in seqs if s.config.scores]
        if scored:  # the chosen tokens' log-probs, as the general way computes them, for these rows alone
            rows = torch.tensor(scored)
            picked = logits[rows].log_softmax(-1).gather(1, torch.from_numpy(chosen)[rows, None])[:, 0]
            for r, value in zip(scored, picked.tolist(), strict=True):
                chosen_logprobs[r] = value
        events, done = _collect(seqs, token_ids, chosen_logprobs, batch.cfg.eos_id, None)
        if done:
            batch.remove(done)
        return events
    sources = align.tolist() if align is not None else None  # per row, the source position of its new token
    logprobs = _log_probs(logits, seqs)  # (n, V), rows nobody reads left unnormalised
    beams = [s for s in seqs if s.beam > 1]
    everyone_beams = sum(s.beam for s in beams) == n
    tokens = logits.new_empty(n, dtype=torch.long) if everyone_beams else argmax(logits)  # (n,)
    sampled = [r for s in seqs if s.config.do_sample for r in s.rows]
    if sampled and logprobs is not None:  # (sampled rows always have log-probs)
        idx = torch.tensor(sampled, device=logits.device)
        tokens[idx] = lp.sample(logprobs[idx], st.seed[idx], st.n_gen[idx])
    constrained = [s for s in seqs if s.constraints is not None and s.beam == 1
                   and s.constraints.pending(s.progress[0])]
    if constrained:
        _force_constraints(batch, constrained, logits, tokens, sources)
    if beams and logprobs is not None:  # (beam rows always have log-probs)
        _beam_step(batch, beams, logprobs, tokens, sources)
    batch.record(tokens)
    # token log-probs, read for rows outside beam search; NaN where the sequence asked for no scores. Tokens and
    # log-probs come to the host in one transfer (float64 holds every token id exactly): each is a device sync.
    if logprobs is not None and logprobs.device.type == "cpu":  # no sync to save: two plain reads are cheaper
        chosen, token_ids = logprobs.gather(1, tokens[:, None])[:, 0].tolist(), tokens.tolist()
    elif logprobs is not None:
        both = torch.stack([tokens.double(), logprobs.gather(1, tokens[:, None])[:, 0].double()]).tolist()
        token_ids, chosen = [int(t) for t in both[0]], both[1]
    else:
        token_ids, chosen = tokens.tolist(), [math.nan] * n
    for r in (s.rows[0] for s in seqs if s.beam == 1 and not s.config.scores):
        chosen[r] = math.nan
    events, done = _collect(seqs, token_ids, chosen, batch.cfg.eos_id, sources)
    if done:
        batch.remove(done)
    return events


def _log_probs(logits: Tensor, seqs: list[Sequence]) -> Tensor | None:
    """Log-softmax of the rows that need it: beams, samples, and sequences that report scores.

    Greedy rows of a sequence with `scores=False` need only their argmax; normalising 8,000 to 58,000 logits a row
    costs about as much as choosing the token (0.25 ms for 32 rows of 8,000 on one core). Other rows are left as
    they are (never read); None when no row needs it.
    """
    need = [r for s in seqs if s.beam > 1 or s.config.do_sample or s.config.scores for r in s.rows]
    if len(need) == logits.shape[0]:
        return logits.log_softmax(-1)
    if not need:
        return None
    idx = torch.tensor(need, device=logits.device)
    out = logits.clone()
    out[idx] = logits[idx].log_softmax(-1)
    return out


def _beam_step(batch: DecodeBatch, beams: list[Sequence], logprobs: Tensor, tokens: Tensor,
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
    top_logprobs, top_tokens = top_k(logprobs, K)  # (n, K) best first
    src_rows: list[int] = []
    dst_rows: list[int] = []
    new_tokens: list[int] = []
    new_scores: list[float] = []
    plain = [s for s in beams if s.constraints is None]
    constrained = [s for s in beams if s.constraints is not None]
    chosen = _advance_constrained(constrained, st.score, logprobs, top_logprobs, top_tokens, batch.cfg.eos_id,
                                  sources) if constrained else []
    for seq, picks in zip(constrained, chosen, strict=True):
        for b, (beam, token, score) in enumerate(picks):
            src_rows.append(seq.rows[beam])
            dst_rows.append(seq.rows[b])
            new_tokens.append(token)
            new_scores.append(score)
    host = device.type == "cpu"  # numpy there: its small indexing costs a few us where torch's costs 10-25
    for k in sorted({s.beam for s in plain}):
        group = [s for s in plain if s.beam == k]
        m, c = len(group), min(2 * k, K)
        if host:
            rows_h = np.array([s.rows for s in group])  # (m, k)
            cand_h = (st.score.numpy()[rows_h][..., None] + top_logprobs.numpy()[rows_h, :c]).reshape(m, k * c)
            top_scores, top_ids = torch.from_numpy(cand_h).topk(2 * k, dim=-1)  # (m, 2k), ties as below
            ids_h = top_ids.numpy()
            scores, ids = top_scores.tolist(), ids_h.tolist()
            toks = np.take_along_axis(top_tokens.numpy()[rows_h, :c].reshape(m, k * c), ids_h, 1).tolist()
        else:
            idx = torch.tensor([s.rows for s in group], device=device)  # (m, k)
            cand = (st.score[idx][..., None] + top_logprobs[idx, :c]).view(m, k * c)
            top_scores, top_ids = cand.topk(2 * k, dim=-1)  # (m, 2k)
            cand_tokens = top_tokens[idx, :c].view(m, k * c).gather(1, top_ids)
            # one transfer (float64 holds the float32 scores and every id exactly)
            scores, ids, toks = torch.stack([top_scores.double(), top_ids.double(), cand_tokens.double()]).tolist()
        for j, seq in enumerate(group):
            cands = [(int(i) // c, int(t)) for i, t in zip(ids[j], toks[j], strict=True)]
            picks = _advance_beams(seq, scores[j], cands, batch.cfg.eos_id, sources)
            for b, (beam, token, score) in enumerate(picks):
                src_rows.append(seq.rows[beam])
                dst_rows.append(seq.rows[b])
                new_tokens.append(token)
                new_scores.append(score)
    moved = [(s, d) for s, d in zip(src_rows, dst_rows, strict=True) if s != d]  # a beam kept in place: no copy
    if host:
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


def _advance_beams(seq: Sequence, scores: list[float], cands: list[tuple[int, int]], eos: int,
                   sources: list[int] | None) -> list[tuple[int, int, float]]:
    """Host bookkeeping of one beam sequence: finished hypotheses, and the k beams that go on."""
    k, lpen = seq.beam, seq.config.length_penalty
    picks: list[tuple[int, int, float]] = []
    for rank, (score, (beam, token)) in enumerate(zip(scores, cands, strict=True)):
        if token == eos:
            if rank < k:
                hyp = seq.tokens[beam]
                _add_hyp(seq, Hypothesis(list(hyp), score / (len(hyp) + 1) ** lpen, "eos", _alignment(seq, beam)))
        else:
            picks.append((beam, token, score))
        if len(picks) == k:
            break
    _extend(seq, [(b, t) for b, t, _ in picks], sources)
    seq.scores = [s for _, _, s in picks]
    return picks


def _alignment(seq: Sequence, beam: int) -> list[int] | None:
    return list(seq.aligns[beam]) if seq.aligns is not None else None


def _extend(seq: Sequence, picks: list[tuple[int, int]], sources: list[int] | None) -> None:
    """The beams that go on, (beam they continue, token) each: their tokens and, when kept, alignments."""
    if seq.aligns is not None and sources is not None:
        seq.aligns = [seq.aligns[b] + [sources[seq.rows[b]]] for b, _ in picks]
    seq.tokens = [seq.tokens[b] + [t] for b, t in picks]


def _force_constraints(batch: DecodeBatch, seqs: list[Sequence], logits: Tensor, tokens: Tensor,
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
        lpen = seq.config.length_penalty
        for beam, total in ended:
            hyp = seq.tokens[beam]
            _add_hyp(seq, Hypothesis(list(hyp), total / (len(hyp) + 1) ** lpen, "eos", _alignment(seq, beam)))
        _extend(seq, [(x.beam, x.token) for x in picks], sources)
        seq.scores = [x.score for x in picks]
        seq.progress = [x.progress for x in picks]
        out.append([(x.beam, x.token, x.score) for x in picks])
    return out


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


def _collect(seqs: list[Sequence], tokens: list[int], logprobs: list[float], eos: int,
             sources: list[int] | None) -> tuple[list[Event], list[Sequence]]:
    """Turn the step's tokens into events; returns them and the sequences that finished."""
    events: list[Event] = []
    done: list[Sequence] = []
    for seq in seqs:
        seq.n_gen += 1
        if seq.beam > 1:
            finished = _finish_beam(seq)
        else:
            r = seq.rows[0]
            tok, logprob = tokens[r], logprobs[r]
            seq.scores[0] += logprob
            if seq.constraints is not None:
                seq.progress[0] = seq.constraints.advance(seq.progress[0], tok)
            if tok == eos:
                finished = [Hypothesis(seq.tokens[0], seq.scores[0], "eos", _alignment(seq, 0))]
            else:
                seq.tokens[0].append(tok)
                source = None
                if seq.aligns is not None and sources is not None:
                    source = sources[r]
                    seq.aligns[0].append(source)
                events.append(TokenEvent(*seq.key, tok, logprob, source))
                length = seq.n_gen >= seq.max_new
                finished = [Hypothesis(seq.tokens[0], seq.scores[0], "length", _alignment(seq, 0))] if length else None
        if finished is not None:
            events.append(FinishEvent(*seq.key, finished, finished[0].finish_reason))
            done.append(seq)
    return events, done


def _finish_beam(seq: Sequence) -> list[Hypothesis] | None:
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
        _add_hyp(seq, Hypothesis(toks, score / (len(toks) + 1) ** lpen, "length", _alignment(seq, beam)))
    return seq.hyps[: seq.config.num_hypotheses]


def admissible(
    waiting: Iterable[tuple[int, int]],
    free_rows: int,
    *,
    max_tokens: int | None = None,
    max_items: int | None = None,
    batch_empty: bool = False,
    total_free_rows: int | None = None,
) -> int:
    """How many items from the head of a queue to admit now: the one admission rule of generate and the server.

    `waiting` yields (beam_size, source_tokens) per queued sentence, in arrival order; it is read only as far as
    needed. Items are taken in order while their beams fit in `free_rows` (the rows that may be used, e.g. within
    a row limit), and, when given, while the running total of source tokens stays within `max_tokens` and the
    count within `max_items`. The first item is never refused by the token or item limits. When `batch_empty`,
    the first item may also exceed `free_rows`, as long as its beams fit in `total_free_rows` (the cache's really
    free rows; default `free_rows`): an empty batch must make progress whatever the row limit.
    """
    physical = free_rows if total_free_rows is None else total_free_rows
    free, tokens, count = free_rows, 0, 0
    for beam, n_src in waiting:
        if count and ((max_tokens is not None and tokens + n_src > max_tokens)
                      or (max_items is not None and count >= max_items)):
            break
        if beam > free and (count or not batch_empty or beam > physical):
            break
        free -= beam
        tokens += n_src
        count += 1
    return count


def generate(
    net: FrozenTransformer,
    sources: Seq[list[int]],
    config: GenerationConfig | Seq[GenerationConfig],
    max_rows: int = 64,
    batch: DecodeBatch | None = None,
    constraints: Seq[Seq[Term] | None] | None = None,
    constraint_sources: Seq[Seq[Seq[int]] | None] | None = None,
) -> list[list[Hypothesis]]:
    """Translate token-id sources; returns the n-best hypotheses of each, best first.

    Sources join the batch as soon as rows are free (continuous batching), so this is also the offline
    engine. `config` is one setting for all sources, or one per source. Source i decodes under key (0, i).
    `batch`: an empty DecodeBatch to decode in (kept across calls, e.g. for its CUDA graphs) instead of a new one;
    its cache must hold the longest source and output. `constraints`: per source, the constraints its output must
    meet (each a list of alternative token sequences, model.constraints), or None; `constraint_sources`: per source,
    the source positions each of its constraints translates (DecodeBatch.admit), or None.
    """
    configs = [config] * len(sources) if isinstance(config, GenerationConfig) else list(config)
    if len(configs) != len(sources):
        raise ValueError("need one GenerationConfig per source")
    terms = list(constraints) if constraints is not None else [None] * len(sources)
    if len(terms) != len(sources):
        raise ValueError("need one list of constraints (or None) per source")
    widest = max((c.beam_size for c in configs), default=1)
    rows = max(max_rows, widest)
    max_src = max((len(s) for s in sources), default=1)
    max_tgt = max((c.max_new_tokens for c in configs), default=1)
    if batch is None:
        batch = DecodeBatch(net, rows, max_src, max_tgt)
    elif len(batch) or batch.cache.max_src < max_src or batch.cache.max_tgt < min(max_tgt, net.cfg.max_positions):
        raise ValueError("generate's batch must be empty and hold the longest source and output")
    results: dict[SentenceKey, list[Hypothesis]] = {}
    waiting = deque(range(len(sources)))
    while waiting or len(batch):
        count = admissible(((configs[i].beam_size, len(sources[i])) for i in waiting), batch.free_rows)
        admit = [waiting.popleft() for _ in range(count)]
        batch.admit([((0, i), list(sources[i]), configs[i]) for i in admit], [terms[i] for i in admit],
                    [constraint_sources[i] for i in admit] if constraint_sources is not None else None)
        for event in step(batch):
            if isinstance(event, FinishEvent):
                results[event.key] = event.hypotheses
    return [results[(0, i)] for i in range(len(sources))]


def greedy(net: FrozenTransformer, sources: Seq[list[int]], max_new_tokens: int = 256) -> list[list[int]]:
    """Most likely token at each step."""
    config = GenerationConfig(max_new_tokens=max_new_tokens)
    return [h[0].tokens for h in generate(net, sources, config)]


def beam_search(
    net: FrozenTransformer, sources: Seq[list[int]], beam_size: int = 4, num_hypotheses: int = 1,
    **settings: float,
) -> list[list[Hypothesis]]:
    """n-best lists by beam search."""
    config = GenerationConfig(beam_size=beam_size, num_hypotheses=num_hypotheses).update(**settings)
    return generate(net, sources, config)


def sample(net: FrozenTransformer, sources: Seq[list[int]], seed: int, **settings: float) -> list[list[int]]:
    """Random sampling, reproducible by seed."""
    config = GenerationConfig(do_sample=True, seed=seed).update(**settings)
    return [h[0].tokens for h in generate(net, sources, config)]
