"""Shared fixtures. Each test draws fresh random inputs; the seed is in every failure message
(set GQA_FLASH_SEED=<seed> to replay one)."""

import pytest
import torch

from gqa_flash.course import testing


@pytest.fixture
def seed():
    return testing.fresh_seed()


def pytest_collection_modifyitems(config, items):
    """Skip tests marked `gpu` when no CUDA device runs the kernels."""
    from gqa_flash.course import runtime

    if runtime.DEVICE.type == "cuda":
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (kernels run in Triton's interpreter here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fewer_threads():
    # Two cores in CI: torch's own thread pool only adds contention.
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
