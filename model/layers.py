"""Attention, feed-forward, and the encoder and decoder layers."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.config import ModelConfig

ACTIVATION_FUNCTIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


def sinusoidal_table(n_positions: int, d: int) -> Tensor:
    """Positions as [sin | cos] halves over one set of frequencies (the Marian layout)."""
    inv_freq = torch.pow(10000.0, -torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angles = torch.arange(n_positions, dtype=torch.float64)[:, None] * inv_freq  # (P, d/2)
    return torch.cat([angles.sin(), angles.cos()], dim=1).float()  # (P, d)


class _CpuDropout(torch.autograd.Function):
    """Dropout whose mask NumPy's PCG64 draws, 16 random bits an element: on the CPU PyTorch's own generator made
    dropout a fifth of a training step, and this mask is about 3 times cheaper (`bench/train_step.py`). The seed
    comes from PyTorch's generator, so `torch.manual_seed` still decides every mask."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, p: float) -> Tensor:
        n, drop = x.numel(), round(p * 65536)  # p in steps of 2**-16; the scale is the drawn keep rate's inverse
        seed = int(torch.randint(0, 2**62, (1,)))
        bits = np.random.default_rng(seed).bit_generator.random_raw((n + 3) // 4).view(np.uint16)[:n]
        mask = torch.from_numpy(bits >= drop).view(x.shape).to(x.dtype).mul_(65536 / (65536 - drop))
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (mask,) = ctx.saved_tensors
        return grad * mask, None


class Dropout(nn.Module):
    """nn.Dropout, with the CPU's masks drawn as `_CpuDropout` draws them; elsewhere PyTorch's."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu" or self.p >= 1.0:
            return F.dropout(x, self.p, training=True)
        out: Tensor = _CpuDropout.apply(x, self.p)  # type: ignore[no-untyped-call]
        return out

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Attention(nn.Module):
    """Multi-head attention through scaled_dot_product_attention; K/V may come from a cache."""

    def __init__(self, d: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)

    def heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, -1).transpose(1, 2)  # (B, H, T, Dh)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.heads(self.k_proj(x)), self.heads(self.v_proj(x))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool = False) -> Tensor:
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal)
        B, _, T, _ = y.shape
        out: Tensor = self.out_proj(y.transpose(1, 2).reshape(B, T, -1))
        return out

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None, causal: bool = False) -> Tensor:
        """Attention of x over memory (x itself for self-attention); mask is (B, 1, 1|T, S) bool, True = keep."""
        k, v = self.project_kv(memory)
        return self.attend(self.heads(self.q_proj(x)), k, v, mask, causal)


class FeedForward(nn.Module):
    def __init__(self, d: int, d_ff: int, activation: str, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, d_ff)
        self.fc2 = nn.Linear(d_ff, d)
        self.activation = activation
        self.act: Callable[[Tensor], Tensor] = ACTIVATION_FUNCTIONS[activation]
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        y: Tensor = self.fc2(self.dropout(self.act(self.fc1(x))))
        return y


class Residual(nn.Module):
    """A sublayer with its residual connection and LayerNorm, placed before (pre) or after (post)."""

    def __init__(self, d: int, pre_norm: bool, eps: float, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d, eps=eps)
        self.pre_norm = pre_norm
        self.dropout = Dropout(dropout)

    def inp(self, x: Tensor) -> Tensor:
        return self.norm(x) if self.pre_norm else x

    def out(self, x: Tensor, y: Tensor) -> Tensor:
        x = x + self.dropout(y)
        return x if self.pre_norm else self.norm(x)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = Attention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.self_res = Residual(cfg.d_model, pre, cfg.layer_norm_eps, cfg.dropout)
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.dropout)
        self.ff_res = Residual(cfg.d_model, pre, cfg.layer_norm_eps, cfg.dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        h = self.self_res.inp(x)
        x = self.self_res.out(x, self.self_attn(h, h, mask))
        return self.ff_res.out(x, self.ff(self.ff_res.inp(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = Attention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.self_res = Residual(cfg.d_model, pre, cfg.layer_norm_eps, cfg.dropout)
        self.cross_attn = Attention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.cross_res = Residual(cfg.d_model, pre, cfg.layer_norm_eps, cfg.dropout)
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.dropout)
        self.ff_res = Residual(cfg.d_model, pre, cfg.layer_norm_eps, cfg.dropout)

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Training / full recomputation: causal self-attention over all of x."""
        h = self.self_res.inp(x)
        x = self.self_res.out(x, self.self_attn(h, h, None, causal=True))
        x = self.cross_res.out(x, self.cross_attn(self.cross_res.inp(x), memory, src_mask))
        return self.ff_res.out(x, self.ff(self.ff_res.inp(x)))


def embed_scale(cfg: ModelConfig) -> float:
    return math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
