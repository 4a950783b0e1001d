"""A tiny GQA transformer and a task it learns in a few dozen steps: sorting digits.

Notebook 06 trains it twice from the same start on the same batches, once with
the course's attention (``gqa_flash.flash_attention``: the forward and backward
kernels) and once with PyTorch's ``scaled_dot_product_attention``. If the
kernels' gradients are right, the two loss curves lie on top of each other.

The task needs no download: a sequence is ``L`` random digits, a separator,
then the same digits sorted. The model is a causal language model; the loss
counts only the sorted half, which it can only predict by attending back to
the unsorted half.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

SEPARATOR = 10  # tokens 0..9 are digits
VOCAB = 11


def sorting_batch(batch: int, digits: int, generator: torch.Generator, device="cpu"):
    """Inputs and targets for next-token prediction; targets are -100 (ignored) outside the sorted half."""
    x = torch.randint(0, 10, (batch, digits), generator=generator)
    seq = torch.cat([x, torch.full((batch, 1), SEPARATOR), x.sort(dim=1).values], dim=1)
    inputs, targets = seq[:, :-1].clone(), seq[:, 1:].clone()
    targets[:, : digits] = -100  # predict only after the separator
    return inputs.to(device), targets.to(device)


def sdpa_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def course_attention(q, k, v):
    import gqa_flash

    return gqa_flash.flash_attention(q, k, v, causal=True)


@dataclass
class Config:
    dim: int = 64
    q_heads: int = 4
    kv_heads: int = 2  # GQA: two query heads per KV head
    layers: int = 2
    max_len: int = 64


class Block(nn.Module):
    def __init__(self, cfg: Config, attention):
        super().__init__()
        self.cfg, self.attention = cfg, attention
        self.head_dim = cfg.dim // cfg.q_heads
        self.norm1, self.norm2 = nn.LayerNorm(cfg.dim), nn.LayerNorm(cfg.dim)
        # One projection for Q (q_heads) and K, V (kv_heads each): GQA's saving is here.
        self.qkv = nn.Linear(cfg.dim, (cfg.q_heads + 2 * cfg.kv_heads) * self.head_dim, bias=False)
        self.out = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, 4 * cfg.dim), nn.GELU(), nn.Linear(4 * cfg.dim, cfg.dim))

    def forward(self, x):
        q, k, v = self.project(x)
        return self.finish(x, self.attention(q, k, v))

    # The block in two halves around its attention, so that a generator with a KV cache
    # (gqa_flash/course/lab/generate.py) can put its own attention between them.
    def project(self, x):
        """Q, K, V of ``x`` [B, N, dim]: [B, q_heads, N, D] and twice [B, kv_heads, N, D]."""
        b, n, _ = x.shape
        hd, hq, hkv = self.head_dim, self.cfg.q_heads, self.cfg.kv_heads
        q, k, v = self.qkv(self.norm1(x)).split([hq * hd, hkv * hd, hkv * hd], dim=-1)
        # [B, N, H*D] -> [B, H, N, D]: a transposed view, strides and all (the kernels take any strides).
        return tuple(t.view(b, n, -1, hd).transpose(1, 2) for t in (q, k, v))

    def finish(self, x, a):
        """The rest of the block, given ``x`` [B, N, dim] and the attention's output ``a`` [B, q_heads, N, D]."""
        b, n, _ = x.shape
        x = x + self.out(a.transpose(1, 2).reshape(b, n, self.cfg.q_heads * self.head_dim))
        return x + self.mlp(self.norm2(x))


class TinyGQATransformer(nn.Module):
    def __init__(self, cfg: Config, attention):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, cfg.dim)
        self.pos = nn.Parameter(torch.randn(cfg.max_len, cfg.dim) / math.sqrt(cfg.dim))
        self.blocks = nn.ModuleList(Block(cfg, attention) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


@contextlib.contextmanager
def one_cpu_thread(device):
    """PyTorch's CPU ops on one thread while a tiny model trains on the CPU (then as before). Its tensors hold a few
    thousand numbers: split over the cores, an op costs more than it saves. 100 steps of trained_model took 1.6-2.6 s
    of CPU time on one thread and 13.7-16.4 s on two (4.4-6.9 s and 33-43 s of wall time on two busy cores,
    2026-12); a laptop's many cores can make the difference larger."""
    if torch.device(device).type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train(attention, steps=40, batch=16, digits=8, lr=3e-3, seed=0, device="cpu", dtype=torch.float32,
          cfg: Config | None = None, log_every=0):
    """Train from a fixed start on fixed batches; return the loss after each step."""
    cfg = cfg or Config()
    torch.manual_seed(seed)
    model = TinyGQATransformer(cfg, attention).to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed + 1)
    losses = []
    with one_cpu_thread(device):
        for step in range(steps):
            inputs, targets = sorting_batch(batch, digits, gen, device)
            logits = model(inputs)
            loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if log_every and (step + 1) % log_every == 0:
                print(f"step {step + 1:4d}  loss {loss.item():.4f}")
    return losses


def trained_model(attention, steps=300, batch=64, digits=8, lr=3e-3, seed=0, device="cpu", dtype=torch.float32,
                  cfg: Config | None = None):
    """A model trained as :func:`train` trains one (a fixed start, fixed batches), returned in eval mode."""
    cfg = cfg or Config()
    torch.manual_seed(seed)
    model = TinyGQATransformer(cfg, attention).to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed + 1)
    with one_cpu_thread(device):
        for _ in range(steps):
            inputs, targets = sorting_batch(batch, digits, gen, device)
            loss = F.cross_entropy(model(inputs).float().reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return model.eval()


@torch.no_grad()
def accuracy(model, inputs, targets):
    """(digit accuracy, sequence accuracy) of greedy next-token predictions on the sorted half."""
    predicted = model(inputs).argmax(-1)
    scored = targets != -100
    right = (predicted == targets) | ~scored
    return (right & scored).sum().item() / scored.sum().item(), right.all(dim=1).float().mean().item()


def train_and_evaluate(attention, steps=600, batch=64, digits=8, lr=1e-3, seed=0, device="cpu",
                       dtype=torch.float32, cfg: Config | None = None, eval_every=25, eval_batch=512):
    """Train as :func:`train` does, and every eval_every steps measure the loss and the accuracy on a held-out
    batch (drawn from its own generator, never trained on). Returns one dict per evaluation."""
    cfg = cfg or Config()
    torch.manual_seed(seed)
    model = TinyGQATransformer(cfg, attention).to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    gen, held_out = torch.Generator().manual_seed(seed + 1), torch.Generator().manual_seed(seed + 2)
    test_inputs, test_targets = sorting_batch(eval_batch, digits, held_out, device)
    history = []
    with one_cpu_thread(device):
        for step in range(1, steps + 1):
            inputs, targets = sorting_batch(batch, digits, gen, device)
            loss = F.cross_entropy(model(inputs).float().reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step % eval_every == 0 or step == 1:
                model.eval()
                digit_acc, seq_acc = accuracy(model, test_inputs, test_targets)
                model.train()
                history.append(dict(step=step, train_loss=loss.item(), digit_accuracy=digit_acc,
                                    sequence_accuracy=seq_acc))
    return history
