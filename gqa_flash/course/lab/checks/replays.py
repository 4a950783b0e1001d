"""The usual mistakes' answers on the checks' own inputs, stored, so that a check can name the likely
cause of a wrong answer without shipping a working copy of the exercise.

A check of tiled.py, say, that finds a wrong O compares it with what each usual mistake (a missing
rescale, a mask off by one...) returns on the same case; the first that matches names the part to look
at. Those answers come from float64 models of the graded pieces, and a model with its mistake switched
off *is* the exercise's answer. So the models live in ``tools/make_check_replays.py`` (instructors
only: the student edition leaves ``tools/`` out), and ``replays.pt`` beside this file holds only their
outputs, with the inputs they were computed from: a check runs the student's code on those stored
inputs, not on freshly drawn ones, because ``torch.randn`` draws other last bits on other CPUs.
"""

import functools
from pathlib import Path

import torch

from gqa_flash.course import runtime

PATH = Path(__file__).with_name("replays.pt")


@functools.lru_cache(maxsize=None)
def _stored() -> dict:
    return torch.load(PATH, weights_only=True) if PATH.exists() else {}


def stored(group: str, case: str, dtype: torch.dtype):
    """((q, k, v) on this machine's device in ``dtype``, {mistake: its answer}) stored for ``case`` of
    ``group`` (``"tiled"`` or ``"kernel"``: the checks module that reads them), or None where nothing is
    stored."""
    entry = _stored().get(group, {}).get(case)
    if entry is None:
        return None
    inputs = tuple(t.to(device=runtime.DEVICE, dtype=dtype) for t in entry["inputs"])
    return inputs, entry["answers"]
