"""The inputs of the attention checks, and the GQA head mapping with its usual mistakes.

A :class:`Case` is one small input built to isolate an idea (GQA 8:2, a
ragged length, fp16, a strided layout...) and names the part it isolates, so
that a wrong answer there points at that part. :func:`kv_index` is the map
from query head to KV head, right or wrong in one of the ways students get it
wrong; the float64 replays of naive.py's mistakes use it (tiled.py's answers are stored: replays.py).
"""

import math
from dataclasses import dataclass

import torch

from gqa_flash import testing
from gqa_flash.lab.checks.verdict import fmt

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@dataclass
class Case:
    name: str
    part: object  # the part this case isolates: an int, a tuple of parts, or None
    batch: int = 1
    n_q_heads: int = 1
    n_kv_heads: int = 1
    seq_len: int = 8
    head_dim: int = 16
    causal: bool = True
    dtype: torch.dtype = torch.float32
    layout: str = "contiguous"
    sm_scale: float | None = None
    block_m: int = 16
    block_n: int = 8
    seed: int = 0

    def qkv(self):
        return testing.random_qkv(
            batch=self.batch, n_q_heads=self.n_q_heads, n_kv_heads=self.n_kv_heads, seq_len=self.seq_len,
            head_dim=self.head_dim, dtype=self.dtype, layout=self.layout, seed=self.seed,
        )

    @property
    def scale(self) -> float:
        return self.sm_scale if self.sm_scale is not None else 1.0 / math.sqrt(self.head_dim)


def kv_of(h: int, case: Case) -> int:
    """The KV head that query head ``h`` reads: consecutive query heads share one."""
    return h // (case.n_q_heads // case.n_kv_heads)


def kv_index(n_q_heads, n_kv_heads, how="div"):
    """Every query head's KV head: right ("div"), or one of the usual mistakes."""
    h = torch.arange(n_q_heads)
    idx = {
        "div": h // (n_q_heads // n_kv_heads),
        "mod": h % n_kv_heads,
        "div_kv": h // n_kv_heads,
        "zero": torch.zeros_like(h),
    }[how]
    if int(idx.max()) >= n_kv_heads:
        raise IndexError("variant reads a KV head that does not exist")
    return idx


def where_attention(problem, case: Case, with_tile=False) -> str:
    """Where an attention output is first wrong: the case, the heads, the row and column (and tile)."""
    b, h, i, c = problem.index
    text = f"case \"{case.name}\": batch {b}, query head {h} (should read KV head {kv_of(h, case)}), "
    if with_tile:
        t = i // case.block_m
        text += f"query tile {t} (rows {t * case.block_m}-{min((t + 1) * case.block_m, case.seq_len) - 1}), "
    return text + f"row {i}, column {c}: got {fmt(problem.got)}, expected {fmt(problem.expected)}"
