"""A byte-level GPT trained on the Python standard library's own source files: no download, text every
Python installation has. Files are found through `sysconfig`, read in sorted order, and every 20th file
is held out for evaluation. A sample is a window of `context + 1` bytes (input and shifted target).
"""

from __future__ import annotations

import math
import sysconfig
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from largebatch_trainer.tasks import Task

HELD_OUT_EVERY = 20
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test"}


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return [path for path in sorted(root.rglob("*.py")) if not _SKIP_DIRS & set(path.relative_to(root).parts)]


def corpus(held_out: bool) -> torch.Tensor:
    files = [f for i, f in enumerate(stdlib_files()) if (i % HELD_OUT_EVERY == 0) == held_out]
    data = b"".join(f.read_bytes() + b"\0" for f in files)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


class Windows(torch.utils.data.Dataset):
    """Non-overlapping windows of `context + 1` bytes over one byte tensor."""

    def __init__(self, data: torch.Tensor, context: int):
        self.data, self.context = data, context

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.context

    def __getitem__(self, i: int) -> torch.Tensor:
        start = i * self.context
        return self.data[start : start + self.context + 1].long()


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, width: int, depth: int, heads: int, context: int):
        super().__init__()
        self.tokens = nn.Embedding(256, width)
        self.positions = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256, bias=False)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                # GPT-2 initialisation: residual projections scaled down with depth.
                std = 0.02 / math.sqrt(2 * depth) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def build(width: int = 128, depth: int = 2, heads: int = 4, context: int = 64) -> Task:
    if width % heads:
        raise SystemExit(f"task.args: width ({width}) must be a multiple of heads ({heads})")

    def loss(model: nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, int]:
        logits = model(batch[:, :-1])
        per_token = F.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1), reduction="none")
        return per_token.view(len(batch), -1).mean(dim=1).sum(), len(batch)

    return Task(
        model=GPT(width, depth, heads, context),
        dataset=Windows(corpus(held_out=False), context),
        loss=loss,
        eval_dataset=Windows(corpus(held_out=True), context),
        tokens_per_sample=context,
    )
