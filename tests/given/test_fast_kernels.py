"""The fast kernels (``gqa_flash/fast/``) work in a copy of the course without solutions/.

The course is published to students without the completed graded files, so the fast kernels
must carry everything they need: fp32 inputs, layouts the TMA cannot read and the
backward's D = rowsum(dO * O) included. This test copies the package (and pyproject.toml) into
pytest's tmp_path, without solutions/, and runs the fast kernels there in a fresh interpreter
whose graded files are the student stubs (GQA_FLASH_IMPL=student). An audit hook in that
interpreter fails the run if anything opens or lists a path with a ``solutions`` folder in it.
"""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

COURSE_DIR = Path(__file__).resolve().parents[2]

# Runs in the copy. Each case: q's layout, dtype, head dim; forward (O and LSE) through
# fast_attention_forward, then forward and backward through flash_attention(..., fast=True)
# (the default dQ mode, two passes, with the dK/dV loop over the whole KV group), then one pass,
# "atomic", with one loop a query head: all against the float64 references with the course's
# tolerances.
CHILD = textwrap.dedent('''
    import sys
    from pathlib import Path

    COPY = Path.cwd().resolve()


    def _no_solutions(event, args):
        if event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, bytes, Path)):
            path = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
            if "solutions" in Path(path).parts:
                raise RuntimeError(f"read a solutions folder: {path}")


    sys.addaudithook(_no_solutions)

    import torch

    import gqa_flash
    from gqa_flash.course import impl
    from gqa_flash.fast.backward import INTERPRETER_CONFIG, default_dq_mode, fast_attention_backward
    from gqa_flash.course.testing import assert_lse_matches, assert_matches, gradient_error

    assert Path(gqa_flash.__file__).resolve().is_relative_to(COPY), gqa_flash.__file__
    assert impl.current() == "student"
    try:
        impl.source_dir("solutions")
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("the copy has a solutions folder")


    def inputs(layout, dtype, d, seed, b=1, hq=4, hkv=2, n=37):
        gen = torch.Generator().manual_seed(seed)
        if layout == "transposed":  # q's last dim has stride n: the TMA cannot read it
            q = torch.randn(b, hq, d, n, generator=gen).to(dtype).transpose(-1, -2)
            assert q.stride(-1) != 1
        else:
            q = torch.randn(b, hq, n, d, generator=gen).to(dtype)
        k = torch.randn(b, hkv, n, d, generator=gen).to(dtype)
        v = (torch.randn(b, hkv, n, d, generator=gen) + torch.arange(hkv).view(1, -1, 1, 1)).to(dtype)
        do = torch.randn(b, hq, n, d, generator=gen).to(dtype)
        return q, k, v, do


    CASES = [  # q's layout, dtype, head dim (20 fp16: 40-byte rows, which the TMA cannot read)
        ("contiguous", torch.float16, 32),
        ("transposed", torch.float16, 32),
        ("contiguous", torch.float16, 20),
        ("contiguous", torch.float32, 32),
        ("transposed", torch.float32, 16),
    ]
    for seed, (layout, dtype, d) in enumerate(CASES):
        q, k, v, do = inputs(layout, dtype, d, seed)
        for causal in (True, False):
            ctx = f"{layout} {dtype} d={d} causal={causal}"
            ref, ref_lse = gqa_flash.reference_attention(q, k, v, causal=causal)
            o_fast, lse = gqa_flash.fast_attention_forward(q, k, v, causal=causal, return_lse=True)
            assert o_fast.dtype == dtype and o_fast.shape == q.shape, ctx
            assert_matches("fast_attention_forward O", o_fast, ref, dtype, ctx)
            assert_lse_matches(lse, ref_lse, ctx)

            qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))  # clone keeps strides
            assert qg.stride() == q.stride(), ctx
            o = gqa_flash.flash_attention(qg, kg, vg, causal=causal, fast=True)
            assert_matches("flash_attention(fast=True) O", o, ref, dtype, ctx)
            o.backward(do)
            refs = gqa_flash.reference_gradients(q, k, v, do, causal=causal)
            for name, t, r in zip("QKV", (qg, kg, vg), refs):
                err, bound = gradient_error(t.grad, r, dtype)
                assert err <= bound, f"d{name}: error {err:.3e} > {bound:.3e}; {ctx}"
            assert default_dq_mode(32) == "separate", "the default changed: test the other mode below"
            # The interpreter's dK/dV tile walks the whole group in one loop (FLAT); here one loop a head.
            grads = fast_attention_backward(q, k, v, o_fast, lse, do, causal=causal, dq_mode="atomic",
                                            config=dict(INTERPRETER_CONFIG, FLAT=False))
            for name, g, r in zip("QKV", grads, refs):
                assert g.dtype == dtype and g.shape == r.shape, f"d{name}: {g.dtype} {list(g.shape)}; {ctx}"
                err, bound = gradient_error(g, r, dtype)
                assert err <= bound, f"atomic d{name}: error {err:.3e} > {bound:.3e}; {ctx}"
            print("ok", ctx, flush=True)
    print("all fast-kernel cases passed")
''')


@pytest.mark.timeout(300)
def test_fast_kernels_in_a_course_copy_without_the_completed_files(tmp_path):
    copy = tmp_path / "course"
    shutil.copytree(COURSE_DIR / "gqa_flash", copy / "gqa_flash", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(COURSE_DIR / "pyproject.toml", copy / "pyproject.toml")
    assert not (copy / "solutions").exists()
    env = {
        **os.environ,
        "PYTHONPATH": str(copy),
        "GQA_FLASH_IMPL": "student",  # the graded files in the copy are whatever the package ships
        "PYTHONDONTWRITEBYTECODE": "1",
        # Anything Triton would cache stays in tmp_path (the interpreter compiles nothing).
        "TRITON_HOME": str(tmp_path / "triton"),
        "TRITON_CACHE_DIR": str(tmp_path / "triton" / "cache"),
    }
    result = subprocess.run([sys.executable, "-c", CHILD], cwd=copy, env=env, capture_output=True, text=True,
                            timeout=240)
    log = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr[-4000:]}"
    assert result.returncode == 0, log
    assert "all fast-kernel cases passed" in result.stdout, log
    assert result.stdout.count("ok ") == 10, log
    assert not (copy / "solutions").exists()


def test_fast_backward_ragged_key_block_whose_padding_overflows():
    """In two passes the ragged last key block runs unmasked (gqa_flash/fast/backward.py, item 2):
    keys past N load as zeros, and against a very negative LSE their exp2 overflows to inf. That
    must stay in their own rows of dK and dV, which are never stored. In one pass, where dS also
    reaches dQ, that block must stay masked: this test fails if it is not. Scores near -130 here
    (LSE below -120), so exp2 of a padded key's 0 minus the LSE is inf in fp32.

    The keys spread (standard deviation 1 around -5) so that dQ = scale * sum_j dS_ij K_j is not a
    cancellation: sum_j dS_ij = 0, so a component common to every key drops out of dQ, and with keys
    all near -5 (spread 0.1) dQ was the small difference of large terms, 2-3 times past fp32's
    tolerance for the graded backward as much as for the fast one."""
    import warnings

    import torch

    import gqa_flash
    from gqa_flash.fast.backward import INTERPRETER_CONFIG, fast_attention_backward
    from gqa_flash.course.testing import gradient_error

    gen = torch.Generator().manual_seed(0)
    n, d = 37, 32  # 37 keys: the second 32-key block is ragged
    q = 5.0 + 0.1 * torch.randn(1, 4, n, d, generator=gen)
    k = -5.0 + torch.randn(1, 2, n, d, generator=gen)
    v, do = torch.randn(1, 2, n, d, generator=gen), torch.randn(1, 4, n, d, generator=gen)
    for causal in (True, False):
        o, lse = gqa_flash.fast_attention_forward(q, k, v, causal=causal, return_lse=True)
        assert lse.max() < -100, "the case must make padded keys overflow"
        refs = gqa_flash.reference_gradients(q, k, v, do, causal=causal)
        for mode, flat in (("separate", True), ("separate", False), ("atomic", True), ("atomic", False)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's numpy reports the overflow
                grads = fast_attention_backward(q, k, v, o, lse, do, causal=causal, dq_mode=mode,
                                                config=dict(INTERPRETER_CONFIG, FLAT=flat))
            ctx = f"causal={causal}, {mode}, flat={flat}"
            for name, g, r in zip("QKV", grads, refs):
                assert torch.isfinite(g).all(), f"d{name} has inf or NaN ({ctx})"
                err, bound = gradient_error(g, r, torch.float32)
                assert err <= bound, f"d{name}: error {err:.3e} > {bound:.3e} ({ctx})"


@pytest.mark.parametrize("n_q_heads, n_kv_heads, seq_len", [(4, 2, 37), (8, 2, 50), (8, 1, 16)])
def test_fast_forward_with_two_query_heads_a_program(n_q_heads, n_kv_heads, seq_len):
    """HEADS=2 (gqa_flash/fast/forward.py, item 6): the same rows of two query heads of one KV group
    a program. Every head's output and LSE against float64, in both launch orders, causal or not,
    ragged lengths: a program that paired the wrong heads, read the second head's rows at the first
    one's offset, or stored the second head's LSE in the first's, fails here."""
    import torch

    from gqa_flash.fast.forward import fast_attention_forward
    from gqa_flash.course.testing import assert_attention_matches, random_qkv

    q, k, v = random_qkv(2, n_q_heads, n_kv_heads, seq_len, 32, dtype=torch.float32, seed=seq_len)
    config = dict(BLOCK_M=32, BLOCK_N=16, SUBTILES=2, HEADS=2)
    for causal in (True, False):
        for group_major in (True, False):
            result = fast_attention_forward(q, k, v, causal=causal, return_lse=True, config=config,
                                            group_major=group_major)
            assert_attention_matches(result, q, k, v, causal=causal, sm_scale=None, return_lse=True,
                                     context=f"HEADS=2, causal={causal}, group_major={group_major}")


@pytest.mark.parametrize("config, heads", [(dict(SUBTILES=1, HEADS=2), (4, 2)), (dict(SUBTILES=2, HEADS=2), (3, 1)),
                                           (dict(SUBTILES=2, HEADS=4), (8, 2))])
def test_fast_forward_refuses_head_pairs_it_cannot_make(config, heads):
    import torch

    from gqa_flash.fast.forward import fast_attention_forward

    q = torch.randn(1, heads[0], 16, 32)
    k = v = torch.randn(1, heads[1], 16, 32)
    with pytest.raises(ValueError, match="config: HEADS must be 1, or 2 with SUBTILES=2"):
        fast_attention_forward(q, k, v, config=dict(BLOCK_M=32, BLOCK_N=16, **config))


def test_fast_kernels_launch_the_autotuners_pick_directly_from_a_keys_second_call(monkeypatch):
    """On a GPU a fast kernel's first call for a key (length, heads, head dim, causal, dtype) runs the
    autotuner; from the second call on the kernel launches the autotuner's pick directly, because the
    autotuner's own look-up is host time that a short call's GPU waits for (``_picks`` in
    gqa_flash/fast/forward.py and backward.py). Here stand-in autotuners, which launch tiles of the
    interpreter's size and count their calls, take the GPU's place. A key's first call goes through
    them, its second does not, a new length or causal flag does again; the direct launches give the same
    bits, pass against float64, carry the pick's warps, stages and register cap, and leave
    ``best_config`` (the bench's tiles column) naming the pick of the key that ran last."""
    import torch
    import triton

    import gqa_flash
    from gqa_flash.course import runtime
    from gqa_flash.fast import backward as fast_backward, forward as fast_forward
    from gqa_flash.course.testing import assert_attention_matches, gradient_error, random_qkv

    class StandIn:
        """Picks ``configs[0]`` at its first tuning, ``configs[1]`` at its second, ... and launches it."""
        def __init__(self, kernel, configs, set_block_shapes, desc_names):
            self.kernel, self.set_block_shapes, self.desc_names = kernel, set_block_shapes, desc_names
            self.configs, self.best_config, self.calls = configs, None, 0

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                self.best_config = self.configs[self.calls % len(self.configs)]
                self.calls += 1
                config = self.best_config.all_kwargs()
                self.set_block_shapes({**dict(zip(self.desc_names, args)), **config,
                                       "HEAD_DIM_PAD": kwargs["HEAD_DIM_PAD"]})
                self.kernel[grid](*args, **kwargs, **config)
            return launch

    class Recorder:
        """The plain kernel, recording the options of each direct launch."""
        def __init__(self, kernel):
            self.kernel, self.options = kernel, []

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                self.options.append({k: kwargs.get(k) for k in ("num_warps", "num_stages", "maxnreg")})
                self.kernel[grid](*args, **kwargs)
            return launch

    def configs(tile, *options):  # one tile, launched with each set of options in turn
        return [triton.Config(dict(tile), num_warps=w, num_stages=s, maxnreg=r) for w, s, r in options]

    descs = ["q_desc", "k_desc", "v_desc", "do_desc"]
    # The forward's tile differs from the descriptors' placeholder (16 rows): a direct launch that left
    # the tile shapes unset would load the wrong rows.
    forward = StandIn(fast_forward._fast_forward_kernel, configs(dict(BLOCK_M=64, BLOCK_N=32, SUBTILES=2),
                                                                 (8, 2, 96), (4, 3, None), (4, 1, None)),
                      fast_forward._set_block_shapes, ["q_desc", "k_desc", "v_desc", "o_desc"])
    tuners = {"dq": StandIn(fast_backward._fast_dq_kernel,
                            configs(fast_backward.DQ_INTERPRETER_CONFIG, (2, 1, 80), (4, 2, None), (4, 1, None)),
                            fast_backward._set_block_shapes, descs + ["o_desc", "dq_desc"]),
              "separate": StandIn(fast_backward._fast_backward_kernel,
                                  configs(fast_backward.INTERPRETER_CONFIG, (8, 3, 120), (4, 2, None), (4, 1, None)),
                                  fast_backward._set_block_shapes, descs + ["dk_desc", "dv_desc"])}
    direct = {"forward": Recorder(fast_forward._fast_forward_kernel),
              "dq": Recorder(fast_backward._fast_dq_kernel), "separate": Recorder(fast_backward._fast_backward_kernel)}
    monkeypatch.setattr(runtime, "INTERPRETER", False)  # the GPU's path; the kernels still run interpreted
    monkeypatch.setattr(fast_forward, "_picks", {})
    monkeypatch.setattr(fast_backward, "_picks", {})
    monkeypatch.setattr(fast_forward, "_kernel", lambda: forward)
    monkeypatch.setattr(fast_backward, "_kernel", lambda name: tuners[name])
    monkeypatch.setattr(fast_forward, "_fast_forward_kernel", direct["forward"])
    monkeypatch.setattr(fast_backward, "_fast_dq_kernel", direct["dq"])
    monkeypatch.setattr(fast_backward, "_fast_backward_kernel", direct["separate"])

    def run(seq_len, causal=True):
        q, k, v = random_qkv(1, 4, 2, seq_len, 32, dtype=torch.float16, seed=seq_len)
        do = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(torch.float16)
        o, lse = fast_forward.fast_attention_forward(q, k, v, causal=causal, return_lse=True)
        context = f"N={seq_len}, causal={causal}"
        assert_attention_matches((o, lse), q, k, v, causal=causal, sm_scale=None, return_lse=True, context=context)
        grads = fast_backward.fast_attention_backward(q, k, v, o, lse, do, causal=causal)
        for name, g, r in zip("QKV", grads, gqa_flash.reference_gradients(q, k, v, do, causal=causal)):
            err, bound = gradient_error(g, r, torch.float16)
            assert err <= bound, f"d{name}: error {err:.3e} > {bound:.3e} ({context})"
        return o, lse, *grads

    def calls():
        return forward.calls, tuners["dq"].calls, tuners["separate"].calls

    first = run(37)
    assert calls() == (1, 1, 1), "a key's first call must go through the autotuner"
    second = run(37)
    assert calls() == (1, 1, 1), "the second call of a key must launch the autotuner's pick directly"
    for name, a, b in zip(["O", "LSE", "dQ", "dK", "dV"], first, second):
        assert torch.equal(a, b), f"{name}: the direct launch differs from the autotuned one"
    for name, options in [("forward", (8, 2, 96)), ("dq", (2, 1, 80)), ("separate", (8, 3, 120))]:
        assert direct[name].options == [dict(zip(("num_warps", "num_stages", "maxnreg"), options))], (
            f"{name}: the direct launch must carry the pick's warps, stages and register cap")
    run(50)
    assert calls() == (2, 2, 2), "a new length is a new key: the autotuner must pick again"
    run(37, causal=False)
    assert calls() == (3, 3, 3), "causal or not is part of the key: the autotuner must pick again"
    run(37)
    assert calls() == (3, 3, 3)
    for name, tuner in [("forward", forward), *tuners.items()]:
        assert tuner.best_config is tuner.configs[0], (
            f"{name}: after a direct launch, best_config must name that key's pick, not the last one tuned")


@pytest.mark.parametrize("head_dim_pad, seq_len, expected", [
    # head_dim 64: the capped 128 x 64 replaces its uncapped twin; the 256-row tile from 4k on
    (64, 2048, {(128, 64, 4, 2, 2, None), (64, 64, 4, 3, 1, None), (128, 64, 8, 3, 1, None),
                (64, 32, 4, 2, 1, None), (128, 64, 4, 3, 2, 168)}),
    (64, 4096, {(256, 64, 8, 3, 2, None), (128, 64, 4, 2, 2, None), (64, 64, 4, 3, 1, None),
                (128, 64, 8, 3, 1, None), (64, 32, 4, 2, 1, None), (128, 64, 4, 3, 2, 168)}),
    # head_dim 128: the cap would spill there, so the uncapped tile stays
    (128, 4096, {(256, 64, 8, 3, 2, None), (128, 64, 4, 3, 2, None), (128, 64, 4, 2, 2, None),
                 (64, 64, 4, 3, 1, None), (128, 64, 8, 3, 1, None), (64, 32, 4, 2, 1, None)}),
    # head_dim 256: only the tiles whose Q rows and K/V stages fit in shared memory (no 256-row tile, no
    # 128 x 64 with 3 stages: 256 KiB)
    (256, 4096, {(128, 64, 4, 2, 2, None), (64, 64, 4, 3, 1, None), (64, 32, 4, 2, 1, None)}),
    # head_dim 32: the cap was not measured there, so both twins stay
    (32, 4096, {(256, 64, 8, 3, 2, None), (128, 64, 4, 3, 2, None), (128, 64, 4, 2, 2, None),
                (64, 64, 4, 3, 1, None), (128, 64, 8, 3, 1, None), (64, 32, 4, 2, 1, None),
                (128, 64, 4, 3, 2, 168)}),
])
def test_fast_forward_candidates_at_a_shape(head_dim_pad, seq_len, expected):
    from gqa_flash.fast import forward

    # As the autotuner calls it: SEQ_LEN among the positional arguments, HEAD_DIM_PAD (passed by keyword) apart.
    kept = forward._prune(forward.CONFIGS, {"SEQ_LEN": seq_len}, HEAD_DIM_PAD=head_dim_pad)
    tiles = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages, c.kwargs["SUBTILES"], c.maxnreg)
             for c in kept}
    assert tiles == expected


def test_fast_forward_candidates_follow_the_devices_shared_memory(monkeypatch):
    """On a GPU whose programs may hold 99 KiB of shared memory (an RTX 4090's, not the H200's 227), only
    the tiles whose Q rows and K/V stages fit are candidates: the autotuner asks the device, not a constant."""
    from gqa_flash.fast import forward

    assert forward.shared_memory() == forward.SHARED_MEMORY, "the interpreter has no device to ask"
    monkeypatch.setattr(forward, "shared_memory", lambda device=None: 101_376)
    kept = forward._prune(forward.CONFIGS, {"SEQ_LEN": 4096}, HEAD_DIM_PAD=128)
    tiles = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages, c.kwargs["SUBTILES"], c.maxnreg)
             for c in kept}
    assert tiles == {(128, 64, 4, 2, 2, None), (64, 32, 4, 2, 1, None)}
