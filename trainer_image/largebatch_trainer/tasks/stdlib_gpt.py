"""A byte-level GPT trained on the Python standard library's own source files: no download, text every
Python installation has. Files are found through `sysconfig`, read in sorted order, and every 20th file
is held out for evaluation. A sample is a window of `context + 1` bytes (input and shifted target).

Parametrization (`task.args.parametrization`): `standard` (GPT-2's) or `mup`, the maximal update
parametrization of Tensor Programs V through the `mup` package, so that hyperparameters tuned on a
narrow model (`lbctl sweep`) carry over to a wide one. Under μP, against the base width
`task.args.baseWidth` (where the two parametrizations are the same model):
- the output layer is mup's `MuReadout` (its logits divided by width / baseWidth), drawn as the standard
  model's (std 0.02, mup's default) rather than zeroed: at 1,000 steps the zero readout left the wide
  models behind (benchmarks/README.md, "Why μP seemed not to transfer");
- attention scores are scaled by 1/d_head (times sqrt(d_head at the base width)), not 1/sqrt(d_head):
  query and key become correlated during training, so their dot product grows like d_head;
- hidden matrices are drawn with variance ∝ 1/fan-in (mup.init), embeddings with a constant one;
- `mup.set_base_shapes` marks every parameter's width dimensions, from which the trainer's optimizer
  gives each parameter group μP's learning rate (largebatch_trainer.optim, docs/trainer.md).
"""

from __future__ import annotations

import functools
import math
import sysconfig
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from largebatch.errors import TaskError
from largebatch_trainer.tasks import Task, blocks_of_classes

HELD_OUT_EVERY = 20
PARAMETRIZATIONS = ("standard", "mup")
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test"}


@functools.cache  # the training and the held-out corpus both split this list: one walk of the tree
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
    def __init__(self, width: int, heads: int, attention_scale: float | None):
        super().__init__()
        self.heads, self.attention_scale = heads, attention_scale
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.attention_scale)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class Tokens(nn.Embedding):
    """The token embedding, drawn by GPT.initialise only. nn.Embedding draws in its constructor too, and
    that draw on the meta device (where mup_model builds its references) imports torch._dynamo first:
    2.5 s of every process that builds the μP model, each worker at each start."""

    def reset_parameters(self) -> None:
        pass


class GPT(nn.Module):
    """GPT-2's architecture; `base_width` set: its μP version against that base width (see above)."""

    def __init__(self, width: int, depth: int, heads: int, context: int, base_width: int | None = None):
        super().__init__()
        self.depth = depth
        # μP: 1/d_head, equal to standard attention's 1/sqrt(d_head) at the base width.
        scale = math.sqrt(base_width // heads) / (width // heads) if base_width else None
        self.tokens = Tokens(256, width)
        self.positions = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList(Block(width, heads, scale) for _ in range(depth))
        self.ln = nn.LayerNorm(width)
        if base_width:
            from mup import MuReadout

            self.head = MuReadout(width, 256, bias=False)
        else:
            self.head = nn.Linear(width, 256, bias=False)
            self.initialise(nn.init.normal_)

    def initialise(self, normal_) -> None:
        """GPT-2's initialisation (residual projections scaled down with depth) with `normal_`: torch's,
        or mup's, which narrows matrices as their fan-in grows past the base width."""
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            std = 0.02 / math.sqrt(2 * self.depth) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
            normal_(p, std=std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def build(
    width: int = 128,
    depth: int = 2,
    heads: int = 4,
    context: int = 64,
    parametrization: str = "standard",
    baseWidth: int = 128,  # spelt as task.args spells it in the job file
) -> Task:
    if parametrization not in PARAMETRIZATIONS:
        raise TaskError(f"task.args.parametrization {parametrization!r}: use one of {', '.join(PARAMETRIZATIONS)}")
    for name, value in (("width", width), ("baseWidth", baseWidth)):
        if value % heads:
            raise TaskError(f"task.args: {name} ({value}) must be a multiple of heads ({heads})")

    def loss(model: nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, int]:
        logits = model(batch[:, :-1])
        per_token = F.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1), reduction="none")
        return per_token.view(len(batch), -1).mean(dim=1).sum(), len(batch)

    return Task(
        model=mup_model(width, depth, heads, context, baseWidth)
        if parametrization == "mup"
        else GPT(width, depth, heads, context),
        dataset=Windows(corpus(held_out=False), context),
        loss=loss,
        eval_dataset=Windows(corpus(held_out=True), context),
        tokens_per_sample=context,
        shard_units=blocks_of_classes(Block.__name__),
    )


def mup_model(width: int, depth: int, heads: int, context: int, base_width: int) -> GPT:
    """The μP GPT: its base shapes set against the same model at `base_width` (and at twice that, which
    tells mup which dimensions are widths), then initialised the μP way."""
    import mup

    model = GPT(width, depth, heads, context, base_width)
    with torch.device("meta"):  # shapes only: nothing is allocated for the two references
        base = GPT(base_width, depth, heads, context, base_width)
        delta = GPT(2 * base_width, depth, heads, context, base_width)
    mup.set_base_shapes(model, base, delta=delta)
    model.initialise(mup.init.normal_)
    return model
