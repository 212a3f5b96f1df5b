"""The rows of a continuous batch and their KV cache: sequences join and leave between any two decoder steps.

This is continuous batching for an encoder-decoder: `admit` encodes new sources in one padded batch and writes
their cross-attention K/V into free cache rows; `forward` runs ONE decoder step for every active row, each at its
own position with its own settings, and returns the processed logits; finished or cancelled sequences leave at
once (`remove`, `cancel`) and their rows are reused. Choosing tokens (greedy, sampling, beam search) is
`model.search`'s, which tells the batch what it chose (`record`) and how beams moved (`reorder`).
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

import numpy as np
import torch
from torch import Tensor

from model import logits as lp
from model.constraints import Constraints, Progress, Term
from model.events import Hypothesis, SentenceKey
from model.frozen import FrozenTransformer
from model.generation import GenerationConfig
from model.graphs import GraphedStep

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")


def inference(fn: Callable[P, R]) -> Callable[P, R]:
    """`torch.inference_mode()` around fn, entered only when the caller is not in it already.

    A decoder step runs this way several times (the step, the batch's forward, its record), a few dozen times a
    sentence; torch's decorator builds and enters a fresh context each time, about 5 us a call on this CPU.
    """
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if torch.is_inference_mode_enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            return fn(*args, **kwargs)
    return wrapper


@dataclass
class Sequence:
    """Host-side record of one source sentence being translated."""

    key: SentenceKey
    config: GenerationConfig
    src_len: int
    rows: list[int]  # cache rows; beam j lives in rows[j]
    max_new: int
    tokens: list[list[int]] = field(default_factory=list)  # per beam
    scores: list[float] = field(default_factory=list)  # per beam, running sum of log-probs
    hyps: list[Hypothesis] = field(default_factory=list)  # finished beams
    n_gen: int = 0
    constraints: Constraints | None = None  # token sequences that must appear in the output (None: no work)
    progress: list[Progress] = field(default_factory=list)  # per beam, its way through the constraints
    aligns: list[list[int]] | None = None  # per beam, the source position of each token (config.alignment)
    plain: bool = False  # greedy, unconstrained, no penalties or alignment: forward()'s short way
    plain_beams: bool = False  # the same for beam search: model.beams.short_beam_step's

    @property
    def beam(self) -> int:
        return self.config.beam_size


class RowState:
    """Per-row tensors that travel with a row when it is reordered or packed.

    The per-row settings live as columns of two tensors (integers, floats) beside the history, so admitting rows
    writes each tensor once and packing rows copies three tensors, whatever the number of settings: on a GPU every
    such write is a launch, and launches, not bytes, are what these small writes cost.
    """

    LONGS = ("last", "n_gen", "seed", "min_new", "top_k")
    FLOATS = ("score", "top_p", "temperature", "penalty")

    def __init__(self, rows: int, max_tgt: int, device: torch.device) -> None:
        self.longs = torch.zeros(rows, len(self.LONGS), dtype=torch.long, device=device)
        self.floats = torch.ones(rows, len(self.FLOATS), dtype=torch.float32, device=device)
        self.floats[:, 0] = 0.0
        self.history = torch.zeros(rows, max_tgt, dtype=torch.long, device=device)  # generated tokens
        # columns as views: writes through them land in the packed tensors
        self.last, self.n_gen, self.seed, self.min_new, self.top_k = self.longs.unbind(1)  # last: next decoder input
        self.score, self.top_p, self.temperature, self.penalty = self.floats.unbind(1)  # score: beam running log-prob
        self._host: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    def tensors(self) -> list[Tensor]:
        return [self.longs, self.floats, self.history]

    def host_views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """history, n_gen, last and min_new as numpy arrays over the same memory (CPU only), made once."""
        if self._host is None:
            self._host = (self.history.numpy(), self.n_gen.numpy(), self.last.numpy(), self.min_new.numpy())
        return self._host

    def host_longs(self) -> tuple[np.ndarray, np.ndarray]:
        """The integer columns as one numpy array over the same memory (CPU only), and the columns of last, n_gen and
        min_new in it: what compiled code that records tokens reads (`model.kernels.greedy_steps`)."""
        return self.longs.numpy(), self._cols

    _cols = np.array([LONGS.index("last"), LONGS.index("n_gen"), LONGS.index("min_new")], np.int64)

    def copy_rows(self, src: Tensor, dst: Tensor) -> None:
        for t in self.tensors():
            t[dst] = t[src]

    def fill(self, start: int, longs: list[list[int]], floats: list[list[float]]) -> None:
        """Rows start.. get these settings, one list per row in LONGS and FLOATS order: one copy per tensor."""
        end = start + len(longs)
        device = self.longs.device
        self.longs[start:end] = torch.tensor(longs, dtype=torch.long).to(device, non_blocking=True)
        self.floats[start:end] = torch.tensor(floats, dtype=torch.float32).to(device, non_blocking=True)


@dataclass
class Encoded:
    """Sources encoded before they join a batch (`DecodeBatch.encode`): every decoder layer's cross-attention K/V
    (L, 2, B, H, S, Dh) and the source mask (B, S)."""

    cross: Tensor
    src_mask: Tensor

    def __len__(self) -> int:
        return int(self.src_mask.shape[0])

    def select(self, keep: list[int]) -> Encoded:
        """The sources at these positions, in this order."""
        if keep == list(range(len(self))):
            return self
        idx = torch.tensor(keep, device=self.src_mask.device)
        return Encoded(self.cross.index_select(2, idx), self.src_mask[idx])


class DecodeBatch:
    """Cache rows of a frozen network, the sequences that own them, and the decoder step they share."""

    def __init__(self, net: FrozenTransformer, rows: int, max_src: int, max_tgt: int, graphs: bool = False) -> None:
        """graphs=True: the decoder step replays CUDA graphs (model.graphs) on a CUDA device, recorded here; on
        other devices it runs the same fixed-shape step eagerly (slower: the tests' check of that step)."""
        self.net = net
        self.cfg = net.cfg
        self.cache = net.new_cache(rows, max_src, max_tgt, fixed=graphs)
        self.state = RowState(rows, self.cache.max_tgt, net.device)
        self._arange = np.arange(rows)
        self.graphed: GraphedStep | None = None
        if graphs:
            try:  # the graphs read the next tokens where the step records them, RowState.last
                self.graphed = GraphedStep(net, self.cache, self.state.last, capture=net.device.type == "cuda")
            except RuntimeError as exc:  # a driver or build that cannot record: decode as usual rather than not at all
                log.warning("CUDA graphs not recorded (%s); the decoder step runs eagerly", exc)
        self.owner: list[Sequence | None] = [None] * rows
        self.seqs: dict[SentenceKey, Sequence] = {}
        self.n = 0  # rows 0..n-1 are active
        banned = {self.cfg.pad_id, self.cfg.decoder_start_id, self.cfg.bos_id} - {self.cfg.eos_id, -1}
        self.banned = torch.tensor(sorted(banned), dtype=torch.long, device=net.device)
        self.banned_host = self.banned.cpu().numpy()
        self.plain = False  # whether the last forward() went the short way (every row plain greedy)
        self.beam_rows: tuple[list[int], Tensor] | None = None  # model.beams.device_beam_step's rows, kept
        self.chosen: np.ndarray | None = None  # the tokens it chose and recorded, if it did (`forward`)
        self.stepped = 0  # how many steps the last `model.search.steps` took

    @property
    def free_rows(self) -> int:
        return self.cache.rows - self.n

    def __len__(self) -> int:
        return len(self.seqs)

    @inference
    def encode(self, sources: Seq[Seq[int]]) -> Encoded:
        """Encode source ids for a later `admit`; raises ValueError if one does not fit the cache.

        Reads the network only, never the batch's rows, so it may run on another thread while the batch decodes
        (the server's encoder thread does, on the CPU)."""
        S = max((len(src) for src in sources), default=0)
        if self.cache.max_src < S or min((len(src) for src in sources), default=0) == 0:
            raise ValueError(f"source length must be between 1 and {self.cache.max_src} tokens")
        pad = self.cfg.pad_id
        src = torch.tensor([list(ids) + [pad] * (S - len(ids)) for ids in sources], dtype=torch.long)
        cross, src_mask = self.net.encode_cross(src.to(self.net.device))  # (L, 2, items, H, S, Dh)
        return Encoded(cross, src_mask)

    @inference
    def admit(self, items: list[tuple[SentenceKey, list[int], GenerationConfig]],
              constraints: Seq[Seq[Term] | None] | None = None,
              sources: Seq[Seq[Seq[int]] | None] | None = None, encoded: Encoded | None = None) -> None:
        """Start decoding (key, source ids, settings) items; raises ValueError if they do not fit.

        `constraints`: per item, what must appear in its output (model.constraints: each constraint a list of
        alternative token sequences), or None. `sources`: per item, the source positions each of its constraints
        translates, or None; a greedy row then starts a term where it attends to the term's words. `encoded`: the
        items' sources as `encode` gave them, when they were encoded ahead; otherwise they are encoded here.
        """
        terms = self._constraints(constraints, len(items), sources)
        need = sum(c.beam_size for _, _, c in items)
        if need > self.free_rows:
            raise ValueError(f"{need} rows needed, {self.free_rows} free")
        if not items:
            return
        if encoded is not None and len(encoded) != len(items):
            raise ValueError(f"{len(encoded)} encoded sources for {len(items)} items")
        keys = [key for key, _, _ in items]
        taken = [k for k in keys if k in self.seqs] or [k for i, k in enumerate(keys) if k in keys[:i]]
        if taken:
            raise ValueError(f"key {taken[0]!r} is already decoding")
        device = self.net.device
        if encoded is None:
            encoded = self.encode([ids for _, ids, _ in items])
        cross, src_mask = encoded.cross, encoded.src_mask
        widths = {c.beam_size for _, _, c in items}
        repeat = widths.pop() if len(widths) == 1 else 1  # every item this many beams: the cache copies each k times
        if repeat > 1:
            src_mask = src_mask.repeat_interleave(repeat, 0)
        elif widths:  # beam sizes differ: each beam's row expanded here
            expand = torch.tensor([i for i, (_, _, c) in enumerate(items) for _ in range(c.beam_size)], device=device)
            cross, src_mask = cross.index_select(2, expand), src_mask[expand]
        start = self.n
        self.cache.admit(start, cross, src_mask, repeat)
        row = start
        longs: list[list[int]] = []
        floats: list[list[float]] = []
        for (key, ids, config), c in zip(items, terms, strict=True):
            rows = list(range(row, row + config.beam_size))
            max_new = min(config.max_new_tokens, self.cache.max_tgt)
            seq = Sequence(key, config, len(ids), rows, max_new, [[] for _ in rows], [0.0] * len(rows))
            if config.alignment or config.replace_unknowns:
                seq.aligns = [[] for _ in rows]
            if c is not None:
                seq.constraints, seq.progress = c, [c.start() for _ in rows]
                if c.sources is not None and seq.aligns is None:  # where the row looks, at every step
                    seq.aligns = [[] for _ in rows]
            simple = (not config.do_sample and c is None and seq.aligns is None and config.repetition_penalty == 1.0
                      and not config.no_repeat_ngram_size)
            seq.plain, seq.plain_beams = simple and config.beam_size == 1, simple and config.beam_size > 1
            self._row_settings(seq, longs, floats)
            self.seqs[key] = seq
            for r in rows:
                self.owner[r] = seq
            row += config.beam_size
        self.state.fill(start, longs, floats)
        self.n = row

    def _constraints(self, constraints: Seq[Seq[Term] | None] | None, n: int,
                     sources: Seq[Seq[Seq[int]] | None] | None) -> list[Constraints | None]:
        """Each item's constraints, checked against the vocabulary before anything is encoded."""
        if constraints is None:
            return [None] * n
        if len(constraints) != n or (sources is not None and len(sources) != n):
            raise ValueError("need one list of constraints (or None) per item, and of their sources if any")
        out: list[Constraints | None] = []
        for i, terms in enumerate(constraints):
            if not terms:
                out.append(None)
                continue
            c = Constraints(terms, sources[i] if sources is not None else None)
            if any(t >= self.cfg.tgt_vocab_size or t == self.cfg.eos_id for t in c.tokens()):
                raise ValueError("constraint tokens must be target-vocabulary ids other than end-of-sentence")
            out.append(c)
        return out

    def _row_settings(self, seq: Sequence, longs: list[list[int]], floats: list[list[float]]) -> None:
        """A new sequence's rows in RowState's column order (LONGS, FLOATS)."""
        c = seq.config
        seed = c.seed if c.seed is not None else random.getrandbits(62)
        for beam in range(seq.beam):
            longs.append([self.cfg.decoder_start_id, 0, seed, c.min_new_tokens, c.top_k])
            # only beam 0 expands at the first step, so beams do not start as copies
            floats.append([0.0 if beam == 0 else -1e9, c.top_p, c.temperature, c.repetition_penalty])

    def cancel(self, key: SentenceKey) -> bool:
        """Stop decoding a sequence and free its rows at once; False if it was not decoding."""
        seq = self.seqs.get(key)
        if seq is None:
            return False
        self.remove([seq])
        return True

    def remove(self, done: list[Sequence]) -> None:
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
            src = torch.tensor(movers, device=self.net.device)
            dst = torch.tensor(holes, device=self.net.device)
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

    @inference
    def forward(self, choose: bool = False) -> tuple[Tensor, Tensor | None]:
        """The decoder step of rows 0..n-1: their next-token logits (n, V) in float32, each row's settings applied,
        and, when a sequence asks for alignment, each row's most attended source position (n,).

        Sets `plain`: whether this step went the short way, every sequence plain greedy (`Sequence.plain`) on the
        CPU, with the settings applied in numpy. Around a fused step of one row, the torch calls of the general way
        cost a quarter as much again as the step itself. With `choose` (the search's step), a short way through the
        fused step also chooses the tokens and records them, in one compiled call after the step's
        (`FusedStep.choose`): they are in `chosen`, else it is None. At one row that saved 0.6 ms a sentence
        against numpy's settings, argmax and `record_host` (the shipped model, int8, paired, ad hoc).
        """
        last = self.state.last[: self.n]
        seqs = list(self.seqs.values())
        fused = self.net.fused
        self.chosen = None
        self.plain = self.graphed is None and self.net.device.type == "cpu" and all(s.plain for s in seqs)
        if self.plain:
            if fused is not None and fused.takes(self.n):
                logits = fused(last, self.cache, out=self.buffer("logits"))  # (n, V) float32
                if choose:
                    history, n_gen, last_host, min_new = self.state.host_views()
                    n = self.n
                    self.chosen = fused.choose(logits.numpy(), self.banned_host, self.cfg.eos_id, n_gen[:n],
                                               min_new[:n], history, last_host[:n])
                    return logits, None
            else:  # more rows than the fused step takes: the settings in numpy still save a few torch calls
                logits = self.net.decode_step(last, self.cache, out=self.buffer("logits")).float()
            self._process_host(logits.numpy())
            return logits, None
        align: list[Tensor] | None = [] if any(s.aligns is not None for s in seqs) else None
        graphed, net = self.graphed, self.net
        if graphed:
            logits = graphed(last, align)
        else:  # (n, V)
            logits = net.decode_step(last, self.cache, align, out=self.buffer("logits")).float()
        self._process(logits, seqs)
        return logits, (align[0].argmax(-1) if align else None)

    def greedy_steps(self, most: int) -> np.ndarray | None:
        """Up to `most` steps of rows 0..n-1 in one compiled call, until a sequence ends its sentence (end of sentence
        or its max_new tokens), where every sequence is plain greedy without scores and the fused CPU step takes the
        rows (`FusedStep.greedy`); None, with nothing done, elsewhere. The tokens (steps, n), chosen and recorded
        as `forward(choose=True)` and the search's plain way choose and record them one step at a time."""
        fused, seqs, n = self.net.fused, list(self.seqs.values()), self.n
        if (self.graphed is not None or fused is None or self.net.device.type != "cpu"
                or not all(s.plain and not s.config.scores for s in seqs) or not fused.takes(n)):
            return None
        max_new = np.empty(n, np.int64)
        for seq in seqs:
            max_new[seq.rows[0]] = seq.max_new
        logits = self.cache.scratch("logits", n, self.cfg.tgt_vocab_size)  # (`buffer`, on the CPU)
        return fused.greedy(self.state.last[:n], self.cache, logits, self.banned_host, self.cfg.eos_id,
                            *self.state.host_longs(), self.state.host_views()[0], max_new, most)

    def fused_logits(self) -> Tensor | None:
        """Rows 0..n-1's next-token logits (n, V) from the fused CPU step as it gives them, no setting applied, for
        a caller that applies them itself (`model.beams.short_beam_step`); None where the fused step does not take
        this step (none on this device, CUDA graphs, more rows than it takes)."""
        fused = self.net.fused
        if fused is None or self.graphed is not None or not fused.takes(self.n):
            return None
        return fused(self.state.last[: self.n], self.cache, out=self.buffer("logits"))

    def buffer(self, name: str) -> Tensor | None:
        """Where this step writes its (n, V) `name` ("logits", "logprobs") on the CPU: a buffer of the cache's, valid
        until the next step (a fresh array a step made glibc's heap grow, or map it anew every step;
        `KVCache.scratch`). None off the CPU, where each step makes its own."""
        if self.net.device.type != "cpu":
            return None
        return self.cache.scratch(name, self.n, self.cfg.tgt_vocab_size)

    def _process_host(self, logits: np.ndarray) -> None:
        """`_process`'s first two rules in numpy (all of it for plain greedy rows): banned tokens, and no end of
        sentence before min_new_tokens."""
        n = self.n
        logits[:, self.banned_host] = lp.NEG_INF
        _, n_gen, _, min_new = self.state.host_views()
        early = n_gen[:n] < min_new[:n]
        if early.any():
            logits[early, self.cfg.eos_id] = lp.NEG_INF

    def _process(self, logits: Tensor, seqs: list[Sequence]) -> None:
        n, st = self.n, self.state
        configs = [s.config for s in seqs]
        if logits.device.type == "cpu":  # numpy's indexing: a few us where torch's two calls cost 20 (beam steps)
            self._process_host(logits.numpy())
        else:
            logits.index_fill_(1, self.banned, lp.NEG_INF)  # one kernel, where `logits[:, banned] =` is several
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

    def record_host(self, tokens: np.ndarray) -> None:
        """`record` on the CPU, from numpy."""
        n = self.n
        history, n_gen, last, _ = self.state.host_views()
        history[self._arange[:n], np.minimum(n_gen[:n], history.shape[1] - 1)] = tokens
        n_gen[:n] += 1
        last[:n] = tokens

    @inference
    def reorder(self, src: Tensor, dst: Tensor) -> None:
        """Row dst[i] continues the beam of row src[i]: its self-attention cache and history (not cross K/V)."""
        self.cache.copy_rows(src, dst, cross=False)  # a beam's rows share one source
        if src.device.type == "cpu":
            history = self.state.host_views()[0]
            history[dst.numpy()] = history[src.numpy()]
        else:
            self.state.history[dst] = self.state.history[src]

    @inference
    def record(self, tokens: Tensor) -> None:
        """Rows 0..n-1 took these tokens (n,): they join the history and are the next step's input."""
        n, st = self.n, self.state
        if tokens.device.type == "cpu":  # numpy's indexing: a few us where torch's costs 60, at every step
            self.record_host(tokens.numpy())
            return
        rows = self.cache.row_ids[:n]
        st.history[rows, st.n_gen[:n].clamp(max=st.history.shape[1] - 1)] = tokens
        st.n_gen[:n] += 1
        st.last[:n] = tokens
