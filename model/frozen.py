"""The network frozen for inference: fused projections, weights prepacked for oneDNN, and the decode step.

Decoding reads every decoder weight once per generated token, so how those products run is the speed.
Freezing builds, from the modules' parameters:
- one product for self-attention's Q, K and V, one for the cross-attention K/V of all decoder layers, and the
  activation or the residual addition fused into the product before it (`model.projection.Projection`: prepacked
  oneDNN on the CPU in float32, a plain GEMM for one row and a small weight, F.linear or the quantized modules
  elsewhere);
The modules keep the parameters for training, saving and export; `freeze` builds this copy from them; build it
again after they change (it holds both copies of the weights and views into them: an older copy would mix old and
new). Dropout is off: this is for inference only.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from model.cache import KVCache
from model.projection import Int8Table, PackedTable, Projection

try:  # numba: the CPU's fused step; without it (the GPU script's bare machine) steps run operator by operator
    from model.fused_encoder import FusedEncoder
    from model.fused_step import FusedStep
    from model.kernels import attend_packed, attend_rows
except (ImportError, RuntimeError) as exc:  # pragma: no cover - RuntimeError: numba finds no writable cache
    logging.getLogger(__name__).warning("the fused CPU decode step is off (%s); set NUMBA_CACHE_DIR", exc)
    FusedStep = attend_rows = attend_packed = FusedEncoder = None  # type: ignore[assignment,misc]
from model.layers import Attention, DecoderLayer, EncoderLayer

if TYPE_CHECKING:
    from model.transformer import Transformer

# Attention kernels on CUDA, cuDNN's left out. PyTorch picks cuDNN's attention on Hopper, which builds an execution
# plan for every new shape; decoding meets new shapes all the time (batch size, source length, target position), and
# on an H100 the first pass over 128 test sentences ran 3 to 16 times slower than a second pass over the same ones
# (bench/gpu/stages.py, docs/benchmarks.md). Flash and memory-efficient attention need no plan.
CUDA_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_kernels(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Inside, scaled_dot_product_attention on CUDA picks among CUDA_ATTENTION; elsewhere it is left alone."""
    return sdpa_kernel(CUDA_ATTENTION) if device.type == "cuda" else contextlib.nullcontext()


class Norms:
    """A layer's LayerNorms, placed before each sublayer (pre) or after each residual sum (post)."""

    def __init__(self, norms: Sequence[nn.LayerNorm], pre: bool) -> None:
        self.params = [(n.normalized_shape, n.weight.detach(), n.bias.detach(), n.eps) for n in norms]
        self.pre = pre

    def norm(self, x: Tensor, i: int) -> Tensor:
        shape, w, b, eps = self.params[i]
        return F.layer_norm(x, shape, w, b, eps)

    def inp(self, x: Tensor, i: int) -> Tensor:
        """The input of sublayer i."""
        return self.norm(x, i) if self.pre else x

    def out(self, x: Tensor, i: int) -> Tensor:
        """Sublayer i's output from its residual sum."""
        return x if self.pre else self.norm(x, i)


MakeProjection = Callable[..., Projection]  # Projection with the network's product settings bound (prepack, half)


def attention_projections(attn: Attention, proj: MakeProjection) -> tuple[Projection, Projection]:
    return proj([attn.q_proj, attn.k_proj, attn.v_proj]), proj([attn.out_proj])


class Packing:
    """Where the real tokens of a right-padded batch (B, S) sit, so the encoder's products skip the padding.

    Every product and norm of an encoder layer works token by token, so it runs on the real tokens alone, packed
    into (N, D); only attention needs the (B, S) layout, and on the CPU in float32 not even it (`attend_packed`). On
    sentences of mixed lengths padding is most of a batch (3.8 times the real tokens for 64 sentences of a test split
    taken in order), and it was most of the encoder's time.
    """

    def __init__(self, mask: Tensor) -> None:
        self.B, self.S = mask.shape
        self.index = mask.flatten().nonzero()[:, 0]  # (N,) positions of real tokens in the flattened batch
        self.attn_mask = mask[:, None, None, :]  # (B, 1, 1, S) True = real token
        self.lengths = mask.sum(1).numpy() if mask.device.type == "cpu" else None  # (B,) int64 real tokens each

    def pad(self, x: Tensor) -> Tensor:
        """(N, F) real tokens -> (B, S, F), zeros at padding."""
        return x.new_zeros(self.B * self.S, x.shape[-1]).index_copy_(0, self.index, x).view(self.B, self.S, -1)

    def pack(self, x: Tensor) -> Tensor:
        """(B, S, F) -> (N, F) real tokens."""
        return x.reshape(self.B * self.S, -1).index_select(0, self.index)


class FrozenEncoderLayer:
    def __init__(self, layer: EncoderLayer, n_heads: int, proj: MakeProjection) -> None:
        self.H = n_heads
        self.qkv, self.o = attention_projections(layer.self_attn, proj)
        self.fc1 = proj([layer.ff.fc1], layer.ff.activation)
        self.fc2 = proj([layer.ff.fc2])
        self.norms = Norms([layer.self_res.norm, layer.ff_res.norm], layer.self_res.pre_norm)

    def __call__(self, x: Tensor, B: int, S: int, packing: Packing | None) -> Tensor:
        """x (N, D): the real tokens of B sources of up to S tokens; packing None when no source is padded."""
        N, D = x.shape
        qkv = self.qkv(self.norms.inp(x, 0))  # (N, 3D)
        if attend_packed is not None and qkv.device.type == "cpu" and qkv.dtype == torch.float32:
            a = self._attend_packed(qkv, B, S, packing)
        else:
            qkv = packing.pad(qkv) if packing is not None else qkv.view(B, S, -1)
            q, k, v = qkv.view(B, S, 3, self.H, -1).permute(2, 0, 3, 1, 4)  # (B, H, S, Dh)
            mask = packing.attn_mask if packing is not None else None
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)  # (B, S, H, Dh)
            a = packing.pack(a) if packing is not None else a.reshape(N, D)
        x = self.norms.out(self.o(a, residual=x), 0)
        return self.norms.out(self.fc2(self.fc1(self.norms.inp(x, 1)), residual=x), 1)

    def _attend_packed(self, qkv: Tensor, B: int, S: int, packing: Packing | None) -> Tensor:
        """On the CPU in float32: each sentence's tokens over its own tokens alone (model.kernels.attend_packed, the
        fused encoder's attention), with no padding and no mask."""
        ns = packing.lengths if packing is not None and packing.lengths is not None else np.full(B, S, np.int64)
        starts = np.zeros(B, np.int64)
        np.cumsum(ns[:-1], out=starts[1:])
        out = qkv.new_empty(qkv.shape[0], qkv.shape[1] // 3)
        attend_packed(np.ascontiguousarray(qkv.numpy()), starts, ns, self.H, out.numpy())
        return out


def attend_one(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """Attention of one query per row: q (B, H, 1, Dh) over k, v (B, H, T, Dh); mask (B, 1, 1, T) or None.

    On the CPU, from 8 rows up, two batched matrix products beat SDPA's flash kernel at one query (the whole
    decode step measured 4% faster at 32 rows, 8% at 128); below that SDPA's single call is quicker.
    """
    if q.device.type != "cpu" or q.shape[0] < 8:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-1, -2))  # (B, H, 1, T)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(-1), v)


def cross_weights(q: Tensor, k: Tensor, mask: Tensor | None) -> Tensor:
    """Attention weights of one query per row averaged over heads: q (B, H, 1, Dh), k (B, H, S, Dh) -> (B, S).

    Computed beside the attention itself (which stays SDPA's), so that a row asking for them changes no other
    row's numbers: the weights are read, never used to decode.
    """
    scores = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-1, -2))  # (B, H, 1, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.float().softmax(-1).mean(1)[:, 0]


class FrozenDecoderLayer:
    def __init__(self, layer: DecoderLayer, n_heads: int, proj: MakeProjection) -> None:
        self.H = n_heads
        self.qkv, self.o = attention_projections(layer.self_attn, proj)
        self.cross_q = proj([layer.cross_attn.q_proj])
        self.cross_o = proj([layer.cross_attn.out_proj])
        self.fc1 = proj([layer.ff.fc1], layer.ff.activation)
        self.fc2 = proj([layer.ff.fc2])
        self.norms = Norms([layer.self_res.norm, layer.cross_res.norm, layer.ff_res.norm], layer.self_res.pre_norm)

    def step(self, x: Tensor, cache: KVCache, i: int, self_mask: Tensor | None, cross_mask: Tensor | None,
             pos: Tensor | None = None, align: list[Tensor] | None = None,
             lengths: tuple[np.ndarray, np.ndarray] | None = None) -> Tensor:
        """One new token per row: x (B, D); this is decoder layer i. Masks are None when no key is padding.

        With `pos` (B,), the rows' positions on the device, attention runs over the whole cache buffers (shapes
        fixed, no host-side bounds): the form a CUDA graph can capture. With `align`, the cross-attention
        weights averaged over heads (B, S) are appended to it. With `lengths` (the rows' target and source
        lengths, on the CPU), attention runs row by row over those lengths (model.kernels.attend_rows).
        """
        B, D = x.shape
        qkv = self.qkv(self.norms.inp(x, 0)).view(B, 3, self.H, -1)  # (B, 3, H, Dh)
        k, v = cache.write(i, qkv[:, 1:]) if pos is None else cache.write_at(i, qkv[:, 1:], pos)  # (B, H, T, Dh)
        if lengths is not None:
            a = self.attend_by_row(qkv.view(B, -1), cache.host_views()[2][i, :, :B], lengths[0], None)
        else:
            a = attend_one(qkv[:, 0, :, None], k, v, self_mask)  # (B, H, 1, Dh)
        x = self.norms.out(self.o(a.view(B, D), residual=x), 0)
        q = self.cross_q(self.norms.inp(x, 1)).view(B, self.H, 1, -1)
        if lengths is not None:
            a = self.attend_by_row(q.view(B, D), cache.host_views()[3][i, :, :B], lengths[1], align)
        else:
            ck, cv = cache.cross(i, B, whole=pos is not None)  # (B, H, S, Dh)
            a = attend_one(q, ck, cv, cross_mask)
            if align is not None:
                align.append(cross_weights(q, ck, cross_mask))
        x = self.norms.out(self.cross_o(a.view(B, D), residual=x), 1)
        return self.norms.out(self.fc2(self.fc1(self.norms.inp(x, 2)), residual=x), 2)

    @staticmethod
    def attend_by_row(q: Tensor, kv: np.ndarray, lengths: np.ndarray, align: list[Tensor] | None) -> Tensor:
        """q (B, >= D) over the K/V buffers kv (2, B, H, T, Dh) row by row -> (B, D); align as in `step`."""
        B, H, T, Dh = kv.shape[1:]
        out = torch.empty(B, H * Dh)
        weights = torch.zeros(B, T) if align is not None else torch.empty(0, 0)
        attend_rows(np.ascontiguousarray(q.numpy()), kv[0], kv[1], lengths, out.numpy(), weights.numpy())
        if align is not None:
            align.append(weights[:, : int(lengths.max())])
        return out


class FrozenTransformer:
    """Encoding, cross-attention K/V and the incremental decode step of a Transformer, for inference only."""

    def __init__(self, model: Transformer, prepack: bool = True, half: bool = False, fused: bool = True,
                 rows8: bool = False, defer: bool = False,
                 drop: Callable[[list[nn.Module]], None] | None = None) -> None:
        cfg = self.cfg = model.cfg
        self.rows8 = rows8  # int8 with a scale per input row (`model.projection.Rows8`)
        self.src_table: Tensor | Int8Table | PackedTable = model.src_embed.weight.detach()
        self.tgt_table: Tensor | Int8Table | PackedTable = model.tgt_embed.weight.detach()
        self.positions = model.positions.to(self.tgt_table.dtype)
        if rows8:  # the tables in int8 too, one for both when the model shares them
            shared = self.src_table.data_ptr() == self.tgt_table.data_ptr()
            self.src_table = Int8Table(self.src_table)
            self.tgt_table = self.src_table if shared else Int8Table(self.tgt_table)
        self.scale = model.scale
        H, pre = cfg.n_heads, cfg.norm == "pre"
        encoder = cast(list[EncoderLayer], list(model.encoder))
        decoder = cast(list[DecoderLayer], list(model.decoder))
        proj = functools.partial(Projection, prepack=prepack, half=half, rows8=rows8, defer=defer)
        self.encoder = [FrozenEncoderLayer(layer, H, proj) for layer in encoder]
        self.decoder = [FrozenDecoderLayer(layer, H, proj) for layer in decoder]
        norms = [cast(nn.LayerNorm, model.encoder_norm), cast(nn.LayerNorm, model.decoder_norm)]
        self.final = Norms(norms, pre) if pre else None  # the stacks' final norms (pre-norm only)
        kv = [lin for layer in decoder for lin in (layer.cross_attn.k_proj, layer.cross_attn.v_proj)]
        self.cross_kv_proj = proj(kv)  # all layers' cross K/V in one product
        self.out = proj([model.out_proj], bias=model.out_bias)
        # the step of a few rows as one compiled function, on the CPU in float32 or int8 (model.fused_step)
        self.fused = FusedStep.build(model, self, drop) if fused and not half and FusedStep is not None else None
        self.operator_decoder = True  # whether the operator step's weights are here (`release_operator_decoder`)
        self.operator_encoder = True  # whether the operator encoder's weights are here (`release_operator_encoder`)
        # and the encoder of short sentences (model.fused_encoder)
        self.fused_encoder = (FusedEncoder.build(model, self) if fused and not half and FusedEncoder is not None
                              else None)
        self.idle_batch: Any = None  # model.search.generate's DecodeBatch between calls (`search._kept_batch`)
        self.decoding = threading.Lock()  # held by each call of model.search.generate

    def release_operator_decoder(self) -> bool:
        """Where the fused step was built for large weights (`FusedStep.large`) and can run (int8: with input ranges
        or a scale per row, not dynamic), let it take every step and drop the operator step's decoder and output
        weights, its copy of the same numbers: the weights stay once. Returns whether it did. Afterwards the operator
        step cannot run: calibration, which observes its products, needs a network that kept it
        (`checkpoint.load(keep_modules=True)`, the default)."""
        fused = self.fused
        if fused is None or not fused.large or not fused.ready():
            return False
        fused.every_step = True
        for layer in self.decoder:
            for p in (layer.qkv, layer.o, layer.cross_q, layer.cross_o, layer.fc1, layer.fc2):
                p.release()
        self.out.release()
        self.operator_decoder = False
        table = fused.share_table()  # a tied output projection: its packed weights are the table too
        if table is not None:
            self.tgt_table = table
            self.src_table = table if self.cfg.share_embeddings else self.src_table
        return True

    def release_operator_encoder(self) -> bool:
        """Where the fused encoder takes sentences of every length (`FusedEncoder.max_tokens`) and can run, drop the
        operator encoder's and the cross K/V product's weights, its copy of the same numbers (int8 on the OPUS-MT
        geometry: about 22 MB). Returns whether it did. Afterwards the operator encoder cannot run: calibration,
        which observes its products, needs a network that kept it (`checkpoint.load(keep_modules=True)`)."""
        fused = self.fused_encoder
        if fused is None or fused.max_tokens < self.cfg.max_positions or not fused.ready():
            return False
        for layer in self.encoder:
            for p in vars(layer).values():
                if isinstance(p, Projection):
                    p.release()
        self.cross_kv_proj.release()
        self.operator_encoder = False
        return True

    def products_changed(self) -> None:
        """Input ranges were set or calibration started or ended: the fused step and encoder read them again."""
        if self.fused is not None:
            self.fused.changed()
        if self.fused_encoder is not None:
            self.fused_encoder.changed()

    def warm_parts(self) -> None:
        """Compile (or load from numba's cache) what the fused step and encoder run when cut over more than one torch
        thread, before the first such step waits for it (the server's schedulers, when given more than one)."""
        if self.fused is not None:
            self.fused.warm_parts()
        if self.fused_encoder is not None:
            self.fused_encoder.warm_parts()

    @property
    def device(self) -> torch.device:
        return self.tgt_table.device

    def projections(self) -> dict[str, Projection]:
        """Every product by a stable name ("encoder.0.qkv", "decoder.1.fc2", "cross_kv", "out")."""
        named = {"cross_kv": self.cross_kv_proj, "out": self.out}
        for stack, layers in (("encoder", self.encoder), ("decoder", self.decoder)):
            for i, layer in enumerate(layers):
                named.update({f"{stack}.{i}.{k}": v for k, v in vars(layer).items() if isinstance(v, Projection)})
        return named

    def embed(self, table: Tensor | Int8Table | PackedTable, ids: Tensor, positions: Tensor) -> Tensor:
        rows = F.embedding(ids, table) if isinstance(table, Tensor) else table.rows(ids)
        return rows * self.scale + positions

    def encode_packed(self, src: Tensor) -> tuple[Tensor, Tensor, Packing | None]:
        """src (B, S) padded with pad_id -> the encoder's output at real tokens (N, D), source mask (B, S), packing."""
        B, S = src.shape
        if not self.operator_encoder:
            raise RuntimeError("this network's operator encoder was released (`release_operator_encoder`): it encodes "
                               "through its fused encoder alone, which does not take this encoding (calibrating? load "
                               "with keep_modules=True)")
        src_mask = src != self.cfg.pad_id
        packing = None if bool(src_mask.all()) else Packing(src_mask)
        x = self.embed(self.src_table, src, self.positions[:S]).view(B * S, -1)
        x = packing.pack(x) if packing is not None else x  # (N, D)
        with attention_kernels(self.device):
            for layer in self.encoder:
                x = layer(x, B, S, packing)
        return (self.final.norm(x, 0) if self.final else x), src_mask, packing

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) padded with pad_id -> memory (B, S, D) and source mask (B, S), True = real token."""
        B, S = src.shape
        x, src_mask, packing = self.encode_packed(src)
        return (packing.pad(x) if packing is not None else x.view(B, S, -1)), src_mask

    def cross_kv(self, memory: Tensor) -> Tensor:
        """Cross-attention K/V of every decoder layer, computed once per source: (L, 2, B, H, S, Dh)."""
        B, S, _ = memory.shape
        return self._cross_layout(self.cross_kv_proj(memory), B, S)

    def encode_cross(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> every decoder layer's cross-attention K/V (L, 2, B, H, S, Dh) and the source mask (B, S).

        `cross_kv(encode(src))` without computing anything at padding.
        """
        B, S = src.shape
        fused = self.fused_encoder
        if fused is not None and fused.ready():
            src_mask = src != self.cfg.pad_id
            lengths = src_mask.sum(1).tolist()
            if min(lengths) <= fused.max_tokens:
                return self._cross_layout(self._encode_by_length(src, src_mask, lengths), B, S), src_mask
        x, src_mask, packing = self.encode_packed(src)
        kv = self.cross_kv_proj(x)  # (N, L*2*D)
        return self._cross_layout(packing.pad(kv) if packing is not None else kv, B, S), src_mask

    def _encode_by_length(self, src: Tensor, src_mask: Tensor, lengths: list[int]) -> Tensor:
        """`encode_cross`'s K/V (B, S, L*2*D) when the fused encoder takes the short sentences: each sentence goes
        the way its own length says, whatever shares the batch, so that its numbers stay its own."""
        B, S = src.shape
        fused = cast("FusedEncoder", self.fused_encoder)
        if min(lengths) == S <= fused.max_tokens:  # no padding (one sentence alone, say): no mask to go through
            x = self.embed(self.src_table, src, self.positions[:S]).view(B * S, -1)
            return fused(x, lengths).view(B, S, -1)
        kv = src.new_zeros(B, S, fused.arrays["w_kv"].shape[0], dtype=self.src_table.dtype)
        for short in (True, False):
            chosen = [b for b, n in enumerate(lengths) if (n <= fused.max_tokens) == short]
            if not chosen:
                continue
            width = max(lengths[b] for b in chosen)
            index = torch.tensor(chosen)
            sub, mask = src.index_select(0, index)[:, :width], src_mask.index_select(0, index)[:, :width]
            if short:  # real tokens sentence after sentence (a boolean mask reads row by row)
                x = self.embed(self.src_table, sub, self.positions[:width])[mask]
                if len(chosen) == B and width == S:  # every sentence: straight into kv (a copy of it less)
                    kv[mask] = fused(x, lengths)
                    continue
                out = kv.new_zeros(len(chosen), width, kv.shape[-1])
                out[mask] = fused(x, [lengths[b] for b in chosen])
            else:
                y, _, packing = self.encode_packed(sub)
                out = self.cross_kv_proj(y)
                out = packing.pad(out) if packing is not None else out.view(len(chosen), width, -1)
            kv[index, :width] = out
        return kv

    def _cross_layout(self, kv: Tensor, B: int, S: int) -> Tensor:
        cfg = self.cfg
        return kv.view(B, S, cfg.decoder_layers, 2, cfg.n_heads, cfg.head_dim).permute(2, 3, 0, 4, 1, 5)

    @property
    def by_length(self) -> bool:
        """Whether `decode_step` attends over each row's own length (CPU, float32 activations, numba) rather than
        over the padded cache with masks."""
        return attend_rows is not None and self.device.type == "cpu" and self.tgt_table.dtype == torch.float32

    def new_cache(self, rows: int, max_src: int, max_tgt: int, fixed: bool = False) -> KVCache:
        """fixed=True: for `decode_step_fixed`, which reads the whole buffers (masked)."""
        cfg = self.cfg
        max_tgt = min(max_tgt, cfg.max_positions)
        return KVCache(cfg.decoder_layers, rows, cfg.n_heads, cfg.head_dim, max_src, max_tgt, self.device,
                       self.tgt_table.dtype, zeroed=fixed or not self.by_length)

    def decode_step(self, tokens: Tensor, cache: KVCache, align: list[Tensor] | None = None,
                    out: Tensor | None = None) -> Tensor:
        """Advance cache rows 0..B-1 by one token each: tokens (B,) -> logits (B, V).

        `align`: gets the last decoder layer's cross-attention weights averaged over heads (B, S), the source
        position each new token looks at (fairseq's alignment layer). `out`: where the fused CPU step may write the
        logits (`KVCache.scratch`); other ways return a new tensor.
        """
        B = tokens.shape[0]
        fused = self.fused
        if fused is not None and fused.takes(B):
            return fused(tokens, cache, align, out=out)
        self._check_operator_decoder()
        x = self.embed(self.tgt_table, tokens, self.positions[cache.pos[:B]])  # (B, D), row b at its own position
        lengths, self_mask, cross_mask = None, None, None
        if self.by_length:
            pos, src_mask = cache.host_views()[:2]
            lengths = (pos[:B] + 1, src_mask[:B].sum(1))  # each row's keys: its tokens so far, its source
        else:
            self_mask, cross_mask = cache.masks(B)
        last = len(self.decoder) - 1
        with attention_kernels(self.device):
            for i, layer in enumerate(self.decoder):
                x = layer.step(x, cache, i, self_mask, cross_mask, align=align if i == last else None,
                               lengths=lengths)
        cache.advance(B)
        return self.out(self.final.norm(x, 1) if self.final else x)

    def _check_operator_decoder(self) -> None:
        if not self.operator_decoder:
            raise RuntimeError("this network's operator decode step was released (`release_operator_decoder`): it "
                               "decodes through its fused step alone, which does not take this step (calibrating? "
                               "load with keep_modules=True)")

    def decode_step_fixed(self, tokens: Tensor, cache: KVCache, align: list[Tensor] | None = None) -> Tensor:
        """`decode_step` over the whole cache buffers, reading nothing on the host: what model.graphs captures.

        Rows 0..B-1 advance, active or not (a graph runs a bucket of rows); a free row's position is clamped to
        the buffer and is reset when the row is admitted. Does not update the cache's host-side bounds. `align`
        as in `decode_step`, over the whole source buffer (B, max_src).
        """
        self._check_operator_decoder()
        B = tokens.shape[0]
        pos = cache.pos[:B].clamp(max=cache.max_tgt - 1)
        x = self.embed(self.tgt_table, tokens, self.positions[pos])  # (B, D)
        self_mask, cross_mask = cache.fixed_masks(pos)
        last = len(self.decoder) - 1
        with attention_kernels(self.device):
            for i, layer in enumerate(self.decoder):
                x = layer.step(x, cache, i, self_mask, cross_mask, pos, align if i == last else None)
        cache.pos[:B] += 1
        return self.out(self.final.norm(x, 1) if self.final else x)


def freeze(model: Transformer, prepack: bool = True, half: bool = False, fused: bool = True,
           rows8: bool = False, defer: bool = False,
           drop: Callable[[list[nn.Module]], None] | None = None) -> FrozenTransformer:
    """The network prepared for inference (fused and prepacked weights); encoding and the decode step go through it.

    Built anew at each call: freeze once after loading (or after each training stretch) and keep the result.
    prepack=False keeps PyTorch's default products: the reference the oneDNN path is tested against.
    half=True (CPU, float32 model): every product reads float16 weights and computes in float32 (`Projection`).
    fused=False: every step runs operator by operator (the reference `model.fused_step` is tested against).
    rows8=True (CPU, float32 model): int8 products with a scale per input row (`model.projection.Rows8`).
    defer=True: the operator products' float and `Rows8` weights are packed later (`Projection.pack`, or at a
    product's first call), so that those the fused step and encoder take over (`release_operator_decoder`,
    `release_operator_encoder`) are never packed at all: `checkpoint.load(keep_modules=False)`. drop (with defer):
    called with modules whose weights the network no longer needs once the fused step has its copy (`FusedStep.build`);
    the network must then take `release_operator_decoder`.
    """
    return FrozenTransformer(model, prepack, half, fused, rows8, defer, drop)
