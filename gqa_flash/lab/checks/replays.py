"""The usual mistakes' answers on the checks' own inputs, stored, so that a check can name the likely
cause of a wrong answer without shipping a working copy of the exercise.

A check of tiled.py, say, that finds a wrong O compares it with what each usual mistake (a missing
rescale, a mask off by one...) returns on the same case; the first that matches names the part to look
at. Those answers come from float64 models of the graded pieces, and a model with its mistake switched
off *is* the exercise's answer. So the models live in ``tools/make_check_replays.py`` (instructors
only: the student edition leaves ``tools/`` out), and ``replays.pt`` beside this file holds only their
outputs, on the checks' cases.

Each entry carries a fingerprint of the inputs it was made from. Where this machine makes other inputs
for a case (another torch drawing other random numbers), its replays are not used: the check still says
what is wrong and where, without guessing why.
"""

import functools
from pathlib import Path

import torch

PATH = Path(__file__).with_name("replays.pt")


@functools.lru_cache(maxsize=None)
def _stored() -> dict:
    return torch.load(PATH, weights_only=True) if PATH.exists() else {}


def fingerprint(*tensors) -> torch.Tensor:
    """Two numbers a tensor, which change when its values do: the float64 sum and sum of squares."""
    values = [t.detach().to("cpu", torch.float64) for t in tensors]
    return torch.tensor([x for t in values for x in (float(t.sum()), float((t * t).sum()))], dtype=torch.float64)


def replays(check: str, case: str, *inputs) -> dict:
    """{mistake: its answer} stored for ``check``'s ``case``, or {} where none is stored or ``inputs`` are
    not the ones it was made from."""
    entry = _stored().get(check, {}).get(case)
    if entry is None:
        return {}
    if not torch.allclose(fingerprint(*inputs), entry["fingerprint"], rtol=1e-12, atol=1e-9):
        return {}
    return entry["answers"]
