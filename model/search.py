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

import torch
from torch import Tensor

from model import logits as lp
from model.beams import alignment, beam_step, beam_steps, finish_beam, force_constraints, short_beam_step
from model.constraints import Term
from model.decode import DecodeBatch, Sequence, inference
from model.events import Event, FinishEvent, Hypothesis, SentenceKey, TokenEvent
from model.frozen import FrozenTransformer
from model.generation import GenerationConfig

# From this many logits on, `argmax` goes through chunk maxima; below, its extra calls cost more than they save
# (crossover between 96k and 116k logits on the 2-core AVX2 EPYC, one thread).
CHUNKED_ARGMAX_MIN = 100_000


def argmax(x: Tensor, chunk: int = 256) -> Tensor:
    """x.argmax(-1) for rows (B, V), first index on ties.

    torch's argmax over a row is not vectorised on the CPU (about 1 ns a logit here: 1.85 ms for 32 rows of 58k).
    There numpy's, which is, runs instead: 9-12 times faster (bench/levers.py). Other CPU tensors, from
    CHUNKED_ARGMAX_MIN logits, go through chunk maxima: the first chunk that holds a row's maximum holds its first
    argmax. On a GPU torch's argmax is one kernel, where the chunks' way launches seven or eight.
    """
    B, V = x.shape
    n = V // chunk
    if x.device.type == "cpu" and x.is_contiguous() and x.dtype == torch.float32:  # numpy's argmax is vectorised
        return torch.from_numpy(x.numpy().argmax(-1))
    if x.device.type != "cpu" or x.numel() < CHUNKED_ARGMAX_MIN or n < 2:
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
    if seqs[0].plain_beams and short_beam_step(batch, seqs):  # every row a plain beam: chosen and moved already
        events, done = _collect(seqs, [], [], batch.cfg.eos_id, None)
        if done:
            batch.remove(done)
        return events
    batch.plain = False  # forward() says otherwise when it takes the short way
    logits, align = batch.forward(choose=True)  # (n, V), (n,) or None
    if batch.plain:  # every row plain greedy: the argmax is all there is to choose
        host = batch.chosen  # (chosen and recorded by the fused step's way)
        if host is None:
            host = logits.numpy().argmax(1)  # the first index on ties, as argmax()
            batch.record_host(host)
        token_ids, chosen_logprobs = host.tolist(), [math.nan] * n
        scored = [s.rows[0] for s in seqs if s.config.scores]
        if scored:  # the chosen tokens' log-probs, as the general way computes them, for these rows alone
            rows = torch.tensor(scored)
            picked = lp.log_softmax(logits[rows]).gather(1, torch.from_numpy(host)[rows, None])[:, 0]
            for r, value in zip(scored, picked.tolist(), strict=True):
                chosen_logprobs[r] = value
        events, done = _collect(seqs, token_ids, chosen_logprobs, batch.cfg.eos_id, None)
        if done:
            batch.remove(done)
        return events
    sources = align.tolist() if align is not None else None  # per row, the source position of its new token
    logprobs = _log_probs(logits, seqs, batch.buffer("logprobs"))  # (n, V), rows nobody reads left unnormalised
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
        force_constraints(batch, constrained, logits, tokens, sources)
    if beams and logprobs is not None:  # (beam rows always have log-probs)
        beam_step(batch, beams, logprobs, tokens, sources)
    batch.record(tokens)
    # token log-probs, read for rows outside beam search; NaN where the sequence asked for no scores. Tokens and
    # log-probs come to the host in one transfer (float64 holds every token id exactly): each is a device sync.
    if everyone_beams:  # beam search reports its scores with its hypotheses, never per token: nothing to read
        token_ids, chosen = [], []
    elif logprobs is not None and logprobs.device.type == "cpu":  # no sync to save: two plain reads are cheaper
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


@inference
def steps(batch: DecodeBatch, most: int) -> list[Event]:
    """Up to `most` steps, until a sequence finishes: the same events as `step` called that many times, with no
    admission in between. Where every row is plain greedy on the CPU's fused step they run in one compiled call
    (`DecodeBatch.greedy_steps`), without the Python around each; where every sentence is a plain beam search of
    one width there, in one loop with the decoder steps posted from compiled code (`model.beams.beam_steps`);
    elsewhere this is one `step`. How many steps ran is left in `batch.stepped`."""
    taken = batch.greedy_steps(most) if most > 1 and batch.n else None
    if taken is None:
        seqs = list(batch.seqs.values())
        beams = beam_steps(batch, seqs, most, lambda s: _collect(s, [], [], batch.cfg.eos_id, None)) \
            if most > 1 and seqs and seqs[0].plain_beams else None
        if beams is not None:
            batch.stepped = beams[1]
            return beams[0]
        batch.stepped = 1
        return step(batch)
    batch.stepped = len(taken)
    seqs = list(batch.seqs.values())
    events: list[Event] = []
    done: list[Sequence] = []
    nan = [math.nan] * batch.n
    for tokens in taken.tolist():
        if done:
            raise RuntimeError("greedy steps went on after a sequence finished")
        more, done = _collect(seqs, tokens, nan, batch.cfg.eos_id, None)
        events += more
    if done:
        batch.remove(done)
    return events


def _log_probs(logits: Tensor, seqs: list[Sequence], out: Tensor | None = None) -> Tensor | None:
    """Log-softmax of the rows that need it: beams, samples, and sequences that report scores.

    Greedy rows of a sequence with `scores=False` need only their argmax; normalising 8,000 to 58,000 logits a row
    costs about as much as choosing the token (0.25 ms for 32 rows of 8,000 on one core). Other rows are left as
    they are (never read); None when no row needs it. `out`: a tensor of the logits' shape to write into
    (`KVCache.scratch`), else a new one.
    """
    need = [r for s in seqs if s.beam > 1 or s.config.do_sample or s.config.scores for r in s.rows]
    if len(need) == logits.shape[0]:
        return torch.log_softmax(logits, -1, out=out)
    if not need:
        return None
    idx = torch.tensor(need, device=logits.device)
    if out is None:
        out = logits.clone()
    else:
        out.copy_(logits)
    out[idx] = logits[idx].log_softmax(-1)
    return out


def _collect(seqs: list[Sequence], tokens: list[int], logprobs: list[float], eos: int,
             sources: list[int] | None) -> tuple[list[Event], list[Sequence]]:
    """Turn the step's tokens into events; returns them and the sequences that finished."""
    events: list[Event] = []
    done: list[Sequence] = []
    for seq in seqs:
        seq.n_gen += 1
        if seq.beam > 1:
            finished = finish_beam(seq)
        else:
            r = seq.rows[0]
            tok, logprob = tokens[r], logprobs[r]
            seq.scores[0] += logprob
            if seq.constraints is not None:
                seq.progress[0] = seq.constraints.advance(seq.progress[0], tok)
            if tok == eos:
                finished = [Hypothesis(seq.tokens[0], seq.scores[0], "eos", alignment(seq, 0))]
            else:
                seq.tokens[0].append(tok)
                source = None
                if seq.aligns is not None and sources is not None:
                    source = sources[r]
                    seq.aligns[0].append(source)
                events.append(TokenEvent(*seq.key, tok, logprob, source))
                length = seq.n_gen >= seq.max_new
                finished = [Hypothesis(seq.tokens[0], seq.scores[0], "length", alignment(seq, 0))] if length else None
        if finished is not None:
            events.append(FinishEvent(*seq.key, finished, finished[0].finish_reason))
            done.append(seq)
    return events, done


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
    terms: list[Seq[Term] | None] = list(constraints) if constraints is not None else [None] * len(sources)
    if len(terms) != len(sources):
        raise ValueError("need one list of constraints (or None) per source")
    widest = max((c.beam_size for c in configs), default=1)
    rows = max(max_rows, widest)
    max_src = max((len(s) for s in sources), default=1)
    max_tgt = max((c.max_new_tokens for c in configs), default=1)
    with net.decoding:  # one call at a time: the fused step's helper threads serve one caller
        own = batch is None
        if batch is None:
            batch = _kept_batch(net, rows, max_src, max_tgt)
        elif (len(batch) or batch.cache.max_src < max_src
              or batch.cache.max_tgt < min(max_tgt, net.cfg.max_positions)):
            raise ValueError("generate's batch must be empty and hold the longest source and output")
        results = _decode(batch, sources, configs, terms, constraint_sources)
        if own:  # (a call that raised leaves its batch to the collector: it may hold sentences)
            net.idle_batch = batch
    return [results[(0, i)] for i in range(len(sources))]


def _decode(batch: DecodeBatch, sources: Seq[list[int]], configs: list[GenerationConfig],
            terms: list[Seq[Term] | None], constraint_sources: Seq[Seq[Seq[int]] | None] | None
            ) -> dict[SentenceKey, list[Hypothesis]]:
    """`generate`'s loop: admit what fits, step, collect each sentence's n-best list."""
    results: dict[SentenceKey, list[Hypothesis]] = {}
    waiting = deque(range(len(sources)))
    while waiting or len(batch):
        count = admissible(((configs[i].beam_size, len(sources[i])) for i in waiting), batch.free_rows)
        admit = [waiting.popleft() for _ in range(count)]
        if admit:
            batch.admit([((0, i), list(sources[i]), configs[i]) for i in admit], [terms[i] for i in admit],
                        [constraint_sources[i] for i in admit] if constraint_sources is not None else None)
        # until a sequence finishes no rows free up, so where none of the waiting sources fits now none would fit
        # at any of the steps before: they may run at once (`steps`)
        blocked = not waiting or not admissible(((configs[i].beam_size, len(sources[i])) for i in waiting),
                                                batch.free_rows)
        for event in steps(batch, batch.cache.max_tgt if blocked else 1):
            if isinstance(event, FinishEvent):
                results[event.key] = event.hypotheses
    return results


SOURCE_BUCKET = 64  # a kept batch's source length, rounded up to a multiple of this: fewer batches made anew


def _kept_batch(net: FrozenTransformer, rows: int, max_src: int, max_tgt: int) -> DecodeBatch:
    """An empty DecodeBatch of `rows` rows for `generate`: the one the network's last call left (`idle_batch`) where
    it has as many rows and target positions and room for the sources, else a new one (the old one dropped first).

    A batch made anew for each call of a few sentences had its cache's pages mapped and touched anew: one beam-4
    sentence a call of the shipped model ran 1.14x faster in a kept batch, with the same tokens (float32, two
    threads, bench/results/ab-engine-kept-batch.json). `release_batch` drops it."""
    idle, net.idle_batch = net.idle_batch, None  # (made by this network's `new_cache`, as the new one would be)
    max_tgt = min(max_tgt, net.cfg.max_positions)
    if idle is not None and idle.cache.rows == rows and idle.cache.max_tgt == max_tgt:
        if idle.cache.max_src >= max_src:
            return idle  # type: ignore[no-any-return]
        max_src = max(max_src, idle.cache.max_src)
    del idle
    bucketed = -(-max_src // SOURCE_BUCKET) * SOURCE_BUCKET
    return DecodeBatch(net, rows, max(max_src, min(bucketed, net.cfg.max_positions)), max_tgt)


def release_batch(net: FrozenTransformer) -> None:
    """Drop the batch `generate` keeps between calls (its memory goes back with the next heap trim)."""
    with net.decoding:
        net.idle_batch = None


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
