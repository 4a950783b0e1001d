"""Which calls the fast forward hands to the Gluon kernel for Hopper (gqa_flash/fast/forward.py's rule).

The kernel itself runs only on a Hopper GPU (tests/gpu/test_gpu_hopper_forward.py); here, the rule,
and that a CPU call never reaches it."""
import pytest
import torch

from gqa_flash.course import runtime
from gqa_flash.fast import forward as fast_forward

HOPPER, AMPERE = 9, 8  # compute capabilities' major numbers
MEASURED = fast_forward.GLUON_TRITON + "0"
BF16 = torch.bfloat16


H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("major, version, dtype, head_dim, seq_len, causal, wanted", [
    (HOPPER, MEASURED, BF16, 128, 1024, True, True),
    (HOPPER, MEASURED, torch.float16, 96, 4096, True, True),
    (HOPPER, MEASURED, BF16, 128, 16384, True, True),
    (HOPPER, MEASURED, BF16, 80, 65536, True, True),
    (HOPPER, MEASURED, BF16, 128, 512, True, False),    # not measured below 1k
    (HOPPER, MEASURED, BF16, 128, 1023, True, False),
    (HOPPER, MEASURED, BF16, 65, 1024, True, True),     # padded to 128 columns, as 128 is
    (HOPPER, MEASURED, BF16, 64, 2048, True, False),    # head_dim 64: the Triton kernel was ahead
    (HOPPER, MEASURED, BF16, 256, 2048, True, False),   # the kernel's tiles stop at 128
    (HOPPER, MEASURED, BF16, 128, 2048, False, False),  # not causal: not measured
    (HOPPER, MEASURED, torch.float32, 128, 2048, True, False),
    (AMPERE, MEASURED, BF16, 128, 2048, True, False),   # no wgmma, no TMA
    (10, MEASURED, BF16, 128, 2048, True, False),  # Blackwell: another kernel's job (tcgen05)
    (HOPPER, "3.8.0", BF16, 128, 2048, True, False),    # Gluon's API moves between versions
])
def test_gluon_rule(major, version, dtype, head_dim, seq_len, causal, wanted):
    assert fast_forward.gluon_wanted(major, H100, version, dtype, head_dim, seq_len, causal) is wanted


@pytest.mark.parametrize("card, wanted", [
    (H100, True), ("NVIDIA H100 PCIe", True),
    ("NVIDIA H200", False),  # the same chip, but neither timed nor tested with the Gluon kernel yet
    ("NVIDIA H20", False),
])
def test_gluon_rule_takes_only_the_cards_it_ran_on(card, wanted):
    assert fast_forward.gluon_wanted(HOPPER, card, MEASURED, BF16, 128, 4096, True) is wanted


@pytest.mark.skipif(not runtime.INTERPRETER, reason="CPU tensors run only in the interpreter")
def test_cpu_calls_never_try_the_gluon_kernel(monkeypatch):
    def refuse(*args):
        raise AssertionError("a CPU call reached the Gluon kernel")

    monkeypatch.setattr(fast_forward, "_try_gluon", refuse)
    q = torch.randn(1, 2, 16, 128, dtype=torch.float16)
    k = torch.randn(1, 1, 16, 128, dtype=torch.float16)
    out = fast_forward.fast_attention_forward(q, k, k.clone(), causal=True)
    assert out.shape == q.shape


def test_the_gluon_configs_fit_a_hopper_program_and_a_bigger_one_is_refused():
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from gqa_flash.fast import hopper_forward

    # The estimate is not below what Triton 3.6 allocated for the routed config (229,752 bytes at head_dim 128,
    # bench/probe_hopper_compile.py), and every shipped config fits.
    assert hopper_forward.shared_bytes(fast_forward.GLUON_CONFIG, 128) >= 229_752
    for config, head_dim_pad in ((fast_forward.GLUON_CONFIG, 128), (hopper_forward.config_for(128), 128),
                                 (hopper_forward.config_for(64), 64)):
        assert hopper_forward.shared_bytes(config, head_dim_pad) <= fast_forward.SHARED_MEMORY
    q = torch.zeros(1, 2, 8, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"config: .*K_STAGES': 4.* bytes of shared memory at head_dim 128"):
        hopper_forward.hopper_attention_forward(q, q[:, :1], q[:, :1], q, None, True, 0.1,
                                                {"BLOCK_N": 128, "K_STAGES": 4, "V_STAGES": 2})


def test_a_gluon_kernel_that_fails_warns_once_a_shape_and_is_not_tried_again(monkeypatch):
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from gqa_flash.fast import hopper_forward

    tries = []

    def broken(*args, **kwargs):
        tries.append(1)
        raise RuntimeError("PassManager::run failed")  # what a Gluon compile error looks like

    monkeypatch.setattr(hopper_forward, "hopper_attention_forward", broken)
    monkeypatch.setattr(fast_forward, "_gluon_failed", {})
    key = ("forward", 1024, 8, 2, 128, True, BF16)
    with pytest.warns(RuntimeWarning, match="the Gluon forward did not run .*PassManager::run failed.*Triton kernel"):
        assert fast_forward._try_gluon(None, None, None, None, None, True, 0.1, key) is False
    assert fast_forward._try_gluon(None, None, None, None, None, True, 0.1, key) is False  # no warning, no try
    assert tries == [1] and key in fast_forward._gluon_failed
