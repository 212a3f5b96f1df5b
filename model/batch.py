"""A batch of sequences decoding together, which sequences may join and leave between any two steps.

This is continuous batching for an encoder-decoder: `admit` encodes new sources in one padded batch and writes
their cross-attention K/V into free cache rows; `step` runs ONE decoder step for every active row, each at its own
position with its own settings; finished or cancelled sequences leave at once and their rows are reused.
Greedy, sampling and beam search share that step. The scheduler of the server and `search.generate` both drive it.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from model import logits as lp
from model.generation import GenerationConfig
from model.transformer import Transformer


@dataclass
class Hypothesis:
    tokens: list[int]  # generated tokens, end-of-sentence excluded
    score: float  # beam search: length-normalised log-probability; otherwise the sum of token log-probs
    finish_reason: str  # "eos" | "length"


@dataclass
class TokenEvent:
    key: Hashable
    token: int
    logprob: float


@dataclass
class FinishEvent:
    key: Hashable
    hypotheses: list[Hypothesis]  # best first
    finish_reason: str  # "eos" | "length"


Event = TokenEvent | FinishEvent


@dataclass
class Sequence:
    """Host-side record of one source sentence being translated."""

    key: Hashable
    config: GenerationConfig
    src_len: int
    rows: list[int]  # cache rows; beam j lives in rows[j]
    max_new: int
    tokens: list[list[int]] = field(default_factory=list)  # per beam
    scores: list[float] = field(default_factory=list)  # per beam, running sum of log-probs
    hyps: list[Hypothesis] = field(default_factory=list)  # finished beams
    n_gen: int = 0

    @property
    def beam(self) -> int:
        return self.config.beam_size


def top_k(x: Tensor, k: int, chunk: int = 256) -> tuple[Tensor, Tensor]:
    """x.topk(k, dim=-1) for wide rows (B, V), 2 to 3 times faster on the CPU at V = 58k.

    The k best of a row lie in the k chunks with the best maxima (and the tail after the last whole chunk), so
    one max pass over the row and two narrow top-ks replace a partial sort of every row.
    """
    B, V = x.shape
    n_chunks = V // chunk
    whole = n_chunks * chunk
    if n_chunks <= k:
        return x.topk(k, dim=-1)
    body = x[:, :whole].view(B, n_chunks, chunk)
    best = body.amax(-1).topk(k, dim=-1).indices  # (B, k) chunks
    cand = torch.cat([body.gather(1, best[..., None].expand(B, k, chunk)).view(B, k * chunk), x[:, whole:]], 1)
    values, pos = cand.topk(k, dim=-1)
    in_body = best.gather(1, (pos // chunk).clamp(max=k - 1)) * chunk + pos % chunk
    return values, torch.where(pos < k * chunk, in_body, pos - k * chunk + whole)


class RowState:
    """Per-row tensors that travel with a row when it is reordered or packed."""

    def __init__(self, rows: int, max_tgt: int, device: torch.device) -> None:
        def long(*shape: int) -> Tensor:
            return torch.zeros(*shape, dtype=torch.long, device=device)

        self.last = long(rows)  # next decoder input
        self.history = long(rows, max_tgt)  # generated tokens
        self.n_gen = long(rows)
        self.score = torch.zeros(rows, dtype=torch.float32, device=device)  # beam running log-prob
        self.seed = long(rows)
        self.min_new = long(rows)
        self.top_k = long(rows)
        self.top_p = torch.ones(rows, device=device)
        self.temperature = torch.ones(rows, device=device)
        self.penalty = torch.ones(rows, device=device)

    def tensors(self) -> list[Tensor]:
        return [self.last, self.history, self.n_gen, self.score, self.seed, self.min_new, self.top_k,
                self.top_p, self.temperature, self.penalty]

    def copy_rows(self, src: Tensor, dst: Tensor) -> None:
        for t in self.tensors():
            t[dst] = t[src]


class DecodeBatch:
    """Cache rows, their sequences, and the one decode step they all share."""

    def __init__(self, model: Transformer, rows: int, max_src: int, max_tgt: int) -> None:
        self.model = model
        self.net = model.frozen()
        self.cfg = model.cfg
        self.cache = self.net.new_cache(rows, max_src, max_tgt)
        self.state = RowState(rows, self.cache.max_tgt, model.device)
        self.owner: list[Sequence | None] = [None] * rows
        self.seqs: dict[Hashable, Sequence] = {}
        self.n = 0  # rows 0..n-1 are active
        banned = {self.cfg.pad_id, self.cfg.decoder_start_id, self.cfg.bos_id} - {self.cfg.eos_id, -1}
        self.banned = torch.tensor(sorted(banned), dtype=torch.long, device=model.device)

    @property
    def free_rows(self) -> int:
        return self.cache.rows - self.n

    def __len__(self) -> int:
        return len(self.seqs)

    @torch.inference_mode()
    def admit(self, items: list[tuple[Hashable, list[int], GenerationConfig]]) -> None:
        """Start decoding (key, source ids, settings) items; raises ValueError if they do not fit."""
        need = sum(c.beam_size for _, _, c in items)
        if need > self.free_rows:
            raise ValueError(f"{need} rows needed, {self.free_rows} free")
        if not items:
            return
        S = max(len(src) for _, src, _ in items)
        if self.cache.max_src < S or min(len(src) for _, src, _ in items) == 0:
            raise ValueError(f"source length must be between 1 and {self.cache.max_src} tokens")
        device = self.model.device
        src = torch.full((len(items), S), self.cfg.pad_id, dtype=torch.long, device=device)
        for i, (_, ids, _) in enumerate(items):
            src[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        memory, src_mask = self.net.encode(src)
        cross = self.net.cross_kv(memory)  # (L, 2, items, H, S, Dh)
        if any(c.beam_size > 1 for _, _, c in items):  # each beam has its own row
            expand = torch.tensor([i for i, (_, _, c) in enumerate(items) for _ in range(c.beam_size)], device=device)
            cross, src_mask = cross.index_select(2, expand), src_mask[expand]
        start = self.n
        self.cache.admit(start, cross, src_mask)
        row = start
        for key, ids, config in items:
            if key in self.seqs:
                raise ValueError(f"key {key!r} is already decoding")
            rows = list(range(row, row + config.beam_size))
            max_new = min(config.max_new_tokens, self.cache.max_tgt)
            seq = Sequence(key, config, len(ids), rows, max_new, [[] for _ in rows], [0.0] * len(rows))
            self._init_rows(seq)
            self.seqs[key] = seq
            for r in rows:
                self.owner[r] = seq
            row += config.beam_size
        self.n = row

    def _init_rows(self, seq: Sequence) -> None:
        c, st, r = seq.config, self.state, slice(seq.rows[0], seq.rows[-1] + 1)
        st.last[r] = self.cfg.decoder_start_id
        st.n_gen[r] = 0
        st.score[r] = -1e9  # only beam 0 expands at the first step, so beams do not start as copies
        st.score[seq.rows[0]] = 0.0
        st.seed[r] = c.seed if c.seed is not None else random.getrandbits(62)
        st.min_new[r] = c.min_new_tokens
        st.top_k[r] = c.top_k
        st.top_p[r] = c.top_p
        st.temperature[r] = c.temperature
        st.penalty[r] = c.repetition_penalty

    def cancel(self, key: Hashable) -> bool:
        """Stop decoding a sequence and free its rows at once; False if it was not decoding."""
        seq = self.seqs.get(key)
        if seq is None:
            return False
        self._remove([seq])
        return True

    def _remove(self, done: list[Sequence]) -> None:
        """Free the rows of finished sequences and pack the active rows back into 0..n-1."""
        freed = sorted(r for seq in done for r in seq.rows)
        for seq in done:
            del self.seqs[seq.key]
            for r in seq.rows:
                self.owner[r] = None
        new_n = self.n - len(freed)
        holes = [r for r in freed if r < new_n]
        movers = [r for r in range(new_n, self.n) if self.owner[r] is not None]
        if holes:
            src = torch.tensor(movers, device=self.model.device)
            dst = torch.tensor(holes, device=self.model.device)
            self.cache.copy_rows(src, dst)
            self.state.copy_rows(src, dst)
            for s, d in zip(movers, holes, strict=True):
                mover = self.owner[s]
                if mover is None:
                    raise RuntimeError("row table out of step with the cache")  # movers are owned rows
                mover.rows[mover.rows.index(s)] = d
                self.owner[d], self.owner[s] = mover, None
        self.n = new_n
        self.cache.set_active(new_n)

    @torch.inference_mode()
    def step(self) -> list[Event]:
        """One decoder step for every active row; returns the tokens and the sequences that finished."""
        if self.n == 0:
            return []
        n, st = self.n, self.state
        seqs = list(self.seqs.values())
        logits = self.net.decode_step(st.last[:n], self.cache).float()  # (n, V)
        self._process(logits, seqs)
        logprobs = logits.log_softmax(-1)  # (n, V)
        beams = [s for s in seqs if s.beam > 1]
        everyone_beams = sum(s.beam for s in beams) == n
        tokens = logits.new_empty(n, dtype=torch.long) if everyone_beams else logits.argmax(-1)  # (n,)
        sampled = [r for s in seqs if s.config.do_sample for r in s.rows]
        if sampled:
            idx = torch.tensor(sampled, device=logits.device)
            tokens[idx] = lp.sample(logprobs[idx], st.seed[idx], st.n_gen[idx])
        if beams:
            self._beam_step(beams, logprobs, tokens)
        chosen = logprobs.gather(1, tokens[:, None])[:, 0]  # token log-probs, read for rows outside beam search
        rows = torch.arange(n, device=logits.device)
        st.history[rows, st.n_gen[:n].clamp(max=st.history.shape[1] - 1)] = tokens
        st.n_gen[:n] += 1
        st.last[:n] = tokens
        return self._collect(seqs, tokens.tolist(), chosen.tolist())

    def _process(self, logits: Tensor, seqs: list[Sequence]) -> None:
        n, st = self.n, self.state
        logits[:, self.banned] = lp.NEG_INF
        configs = [s.config for s in seqs]
        if any(c.min_new_tokens for c in configs):
            lp.forbid_early_eos(logits, st.n_gen[:n], st.min_new[:n], self.cfg.eos_id)
        if any(c.repetition_penalty != 1.0 for c in configs):
            lp.repetition_penalty(logits, st.history[:n], st.n_gen[:n], st.penalty[:n])
        for size in {c.no_repeat_ngram_size for c in configs} - {0}:
            idx = torch.tensor([r for s in seqs if s.config.no_repeat_ngram_size == size for r in s.rows],
                               device=logits.device)
            sub = logits[idx]
            lp.ban_repeated_ngrams(sub, st.history[idx], st.n_gen[idx], size)
            logits[idx] = sub
        if any(c.do_sample for c in configs):
            idx = torch.tensor([r for s in seqs if s.config.do_sample for r in s.rows], device=logits.device)
            sub = logits[idx] / st.temperature[idx, None]
            if any(c.do_sample and (c.top_k or c.top_p < 1.0) for c in configs):
                sub = lp.top_k_top_p(sub, st.top_k[idx], st.top_p[idx])
            logits[idx] = sub

    def _beam_step(self, beams: list[Sequence], logprobs: Tensor, tokens: Tensor) -> None:
        """Advance every beam-search sequence: pick the 2k best continuations, keep k, reorder rows.

        A sequence's 2k best continuations are among the 2k best tokens of each of its beams, so one top-k per
        row is the only pass over the vocabulary.
        """
        st = self.state
        K = min(2 * max(s.beam for s in beams), logprobs.shape[1])
        top_logprobs, top_tokens = top_k(logprobs, K)  # (n, K) best first
        src_rows: list[int] = []
        dst_rows: list[int] = []
        new_tokens: list[int] = []
        new_scores: list[float] = []
        for k in sorted({s.beam for s in beams}):
            group = [s for s in beams if s.beam == k]
            m, c = len(group), min(2 * k, K)
            idx = torch.tensor([s.rows for s in group], device=logprobs.device)  # (m, k)
            cand = (st.score[idx][..., None] + top_logprobs[idx, :c]).view(m, k * c)
            top_scores, top_ids = cand.topk(2 * k, dim=-1)  # (m, 2k)
            cand_tokens = top_tokens[idx, :c].view(m, k * c).gather(1, top_ids)
            for seq, scores, ids, toks in zip(group, top_scores.tolist(), top_ids.tolist(), cand_tokens.tolist(),
                                              strict=True):
                picks = self._advance_beams(seq, scores, [(i // c, t) for i, t in zip(ids, toks, strict=True)])
                for j, (beam, token, score) in enumerate(picks):
                    src_rows.append(seq.rows[beam])
                    dst_rows.append(seq.rows[j])
                    new_tokens.append(token)
                    new_scores.append(score)
        moved = [(s, d) for s, d in zip(src_rows, dst_rows, strict=True) if s != d]  # a beam kept in place: no copy
        if moved:
            src = torch.tensor([s for s, _ in moved], device=tokens.device)
            dst = torch.tensor([d for _, d in moved], device=tokens.device)
            self.cache.copy_rows(src, dst, cross=False)  # a beam's rows share one source
            st.history[dst] = st.history[src]
        rows = torch.tensor(dst_rows, device=tokens.device)
        tokens[rows] = torch.tensor(new_tokens, device=tokens.device)
        st.score[rows] = torch.tensor(new_scores, device=tokens.device)

    def _advance_beams(self, seq: Sequence, scores: list[float], cands: list[tuple[int, int]]) -> list[
        tuple[int, int, float]
    ]:
        """Host bookkeeping of one beam sequence: finished hypotheses, and the k beams that go on."""
        k, eos, lpen = seq.beam, self.cfg.eos_id, seq.config.length_penalty
        picks: list[tuple[int, int, float]] = []
        for rank, (score, (beam, token)) in enumerate(zip(scores, cands, strict=True)):
            if token == eos:
                if rank < k:
                    hyp = seq.tokens[beam]
                    self._add_hyp(seq, Hypothesis(list(hyp), score / (len(hyp) + 1) ** lpen, "eos"))
            else:
                picks.append((beam, token, score))
            if len(picks) == k:
                break
        seq.tokens = [seq.tokens[b] + [t] for b, t, _ in picks]
        seq.scores = [s for _, _, s in picks]
        return picks

    @staticmethod
    def _add_hyp(seq: Sequence, hyp: Hypothesis) -> None:
        seq.hyps.append(hyp)
        seq.hyps.sort(key=lambda h: -h.score)
        del seq.hyps[seq.beam :]

    def _beam_done(self, seq: Sequence) -> bool:
        if len(seq.hyps) < seq.beam:
            return False
        best = max(seq.scores) / seq.n_gen ** seq.config.length_penalty  # transformers' early_stopping=False
        return seq.hyps[-1].score >= best

    def _collect(self, seqs: list[Sequence], tokens: list[int], logprobs: list[float]) -> list[Event]:
        """Turn the step's tokens into events; sequences that finished leave the batch."""
        events: list[Event] = []
        done: list[Sequence] = []
        eos = self.cfg.eos_id
        for seq in seqs:
            seq.n_gen += 1
            if seq.beam > 1:
                finished = self._finish_beam(seq)
            else:
                r = seq.rows[0]
                tok, logprob = tokens[r], logprobs[r]
                seq.scores[0] += logprob
                if tok == eos:
                    finished = [Hypothesis(seq.tokens[0], seq.scores[0], "eos")]
                else:
                    seq.tokens[0].append(tok)
                    events.append(TokenEvent(seq.key, tok, logprob))
                    length = seq.n_gen >= seq.max_new
                    finished = [Hypothesis(seq.tokens[0], seq.scores[0], "length")] if length else None
            if finished is not None:
                events.append(FinishEvent(seq.key, finished, finished[0].finish_reason))
                done.append(seq)
        if done:
            self._remove(done)
        return events

    def _finish_beam(self, seq: Sequence) -> list[Hypothesis] | None:
        if self._beam_done(seq):
            return seq.hyps[: seq.config.num_hypotheses]
        if seq.n_gen < seq.max_new:
            return None
        lpen = seq.config.length_penalty
        for toks, score in zip(seq.tokens, seq.scores, strict=True):
            # scored as if closed by an end-of-sentence, like transformers' forced_eos_token_id (Marian)
            self._add_hyp(seq, Hypothesis(toks, score / (len(toks) + 1) ** lpen, "length"))
        return seq.hyps[: seq.config.num_hypotheses]
