"""The encoder-decoder Transformer: its parameters, and forward for training and reference.

Inference runs on the network frozen from it (`model.frozen.freeze`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from model.config import ModelConfig
from model.layers import DecoderLayer, EncoderLayer, embed_scale, sinusoidal_table


class Transformer(nn.Module):
    positions: Tensor  # (max_positions, d_model) sinusoidal table, a non-persistent buffer

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.src_embed = nn.Embedding(cfg.src_vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embedding(
            cfg.tgt_vocab_size, cfg.d_model, padding_idx=cfg.pad_id
        )
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        pre = cfg.norm == "pre"
        self.encoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if pre else nn.Identity()
        self.out_proj = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        if cfg.tie_output:
            self.out_proj.weight = self.tgt_embed.weight
        self.out_bias = nn.Parameter(torch.zeros(cfg.tgt_vocab_size)) if cfg.output_bias else None
        self.register_buffer("positions", sinusoidal_table(cfg.max_positions, cfg.d_model), persistent=False)
        self.scale = embed_scale(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        for emb in {self.src_embed, self.tgt_embed}:
            nn.init.normal_(emb.weight, std=self.cfg.d_model**-0.5)
            with torch.no_grad():
                emb.weight[self.cfg.pad_id].zero_()

    def embed(self, table: nn.Embedding, ids: Tensor, pos: Tensor) -> Tensor:
        x: Tensor = self.dropout(table(ids) * self.scale + self.positions[pos].to(table.weight.dtype))
        return x

    def logits(self, h: Tensor) -> Tensor:
        y: Tensor = self.out_proj(self.decoder_norm(h))
        return y + self.out_bias if self.out_bias is not None else y

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) padded with pad_id -> memory (B, S, D) and source mask (B, S), True = real token."""
        src_mask = src != self.cfg.pad_id
        S = src.shape[1]
        x = self.embed(self.src_embed, src, torch.arange(S, device=src.device))
        attn_mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        for layer in self.encoder:
            x = layer(x, attn_mask)
        return self.encoder_norm(x), src_mask

    def decode_states(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """The last decoder layer's output (B, T, D) over whole target prefixes (B, T) at once, before the final
        norm and the output projection (`logits`)."""
        T = tgt_in.shape[1]
        x = self.embed(self.tgt_embed, tgt_in, torch.arange(T, device=tgt_in.device))
        cross_mask = src_mask[:, None, None, :]
        for layer in self.decoder:
            x = layer(x, memory, cross_mask)
        return x

    def decode_full(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Decoder over whole target prefixes (B, T) at once -> logits (B, T, V). Training and reference."""
        return self.logits(self.decode_states(tgt_in, memory, src_mask))

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for source src (B, S) and target input tgt_in (B, T)."""
        memory, src_mask = self.encode(src)
        return self.decode_full(tgt_in, memory, src_mask)

    @property
    def device(self) -> torch.device:
        return self.tgt_embed.weight.device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
