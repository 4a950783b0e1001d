"""forward.py: the Triton FlashAttention forward kernel with GQA (40 points).

Points follow harm (README, "How the points are shared"). 32 of the 40 points are ordinary use: every case there mixes
grouped-query heads, a length that is not a multiple of the tiles, fp32 or fp16, a head dim that is
often not a power of two, and K and V in different memory layouts, and runs both with and without the
causal mask, asking for O and the LSE each time. 24 of those points judge O alone, and the LSE's share, the 8
of test_forward_lse_natural_log, judge O and then the LSE. The LSE matters only to the backward pass and to
merges, so a bug in it alone (base 2, the max left out, the wrong rows), with O right, loses those 8 points
and keeps the rest; a bug that shows in O fails most of the 32.
The other 8 points are corner cases, judged on O: one token, sharply peaked scores, head dim 256, skipping
the key blocks past the diagonal, and two mistakes that only a probe of one helper shows on a CPU (a masked
load with no ``other``; batch and head offsets in int32).

On a machine with no GPU the kernel runs in Triton's interpreter, so the shapes here stay small;
tests/gpu/ runs the large ones and bf16 on a GPU.
"""

import pytest
import torch

from gqa_flash.course import testing, tile_counts
from gqa_flash.course.grader.calls import kernel_only, student
from gqa_flash.course.testing import assert_output_matches, case_context, peaked_qkv, random_qkv

F16, F32 = torch.float16, torch.float32


def check(seed, causal=(True, False), sm_scale=None, dtype=F32, layout="contiguous", v_layout=None, qkv=None,
          lse=False, **shape):
    """Run the kernel on one input, with and without the causal mask, asking for O and the LSE; compare O, and
    with ``lse`` the LSE too, with float64."""
    q, k, v = qkv if qkv is not None else random_qkv(dtype=dtype, layout=layout, v_layout=v_layout, seed=seed,
                                                     **shape)
    for c in causal:
        # The kernel must do the work: PyTorch's attention, softmax and matmuls are
        # off limits inside, and at least one Triton kernel must be launched.
        reply = student().call("flash_attention_forward", q, k, v, causal=c, sm_scale=sm_scale, return_lse=True,
                               watch=kernel_only())
        result = reply.value
        assert reply.seen.get("launches", 0) > 0, "flash_attention_forward must launch the Triton kernel"
        layouts = f"layout {layout}" + (f", V layout {v_layout}" if v_layout and v_layout != layout else "")
        assert_output_matches(lse, result, q, k, v, causal=c, sm_scale=sm_scale,
                              context=case_context(seed, q, k, c, layouts))


def case_inputs(case) -> dict:
    """check's (and random_qkv's) keywords for a case (Hq, Hkv, batch, N, D, dtype, K's layout, V's layout)."""
    n_q_heads, n_kv_heads, batch, seq_len, head_dim, dtype, layout, v_layout = case
    return dict(dtype=dtype, layout=layout, v_layout=v_layout, batch=batch, n_q_heads=n_q_heads,
                n_kv_heads=n_kv_heads, seq_len=seq_len, head_dim=head_dim)


# --- ordinary use: 32 points (24 on O, 8 on the LSE) ----------------------------------------------------


GQA_CASES = [  # (Hq, Hkv, batch, N, D, dtype, K's layout, V's layout)
    (8, 2, 2, 29, 24, F32, "contiguous", "bnhd"),
    (6, 3, 2, 21, 48, F16, "bnhd", "contiguous"),
    (4, 1, 1, 40, 80, F32, "strided", "padded"),
    (2, 2, 2, 37, 32, F16, "contiguous", "strided"),
]


@pytest.mark.points(6)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", GQA_CASES, ids=[f"{c[0]}:{c[1]}" for c in GQA_CASES])
def test_forward_gqa_heads(seed, case):
    # GQA 8:2 and 6:3 (odd groups), MQA 4:1, MHA 2:2. Each KV head's values are shifted by its
    # index: a program that reads the wrong KV head writes visibly wrong rows.
    inputs = case_inputs(case)
    qkv = random_qkv(seed=seed, **inputs)
    try:
        check(seed, qkv=qkv, **inputs)
    except AssertionError as failure:
        if type(failure) is not AssertionError:  # the kernel-only, address or integrity guard's verdict, as it is
            raise
        raise AssertionError(f"{_kv_heads_read(*qkv)}{failure}") from None


def _kv_heads_read(q, k, v) -> str:
    """After a failure: the query heads whose rows are attention over another KV head than their own, named first
    (the report keeps a failure's first line)."""
    from gqa_flash.reference import reference_attention

    try:
        out = student().call("flash_attention_forward", q, k, v, causal=True, watch=kernel_only()).value
        if type(out) is not torch.Tensor or out.shape != q.shape:
            return ""
    except Exception:  # a diagnosis only: the failure it would add to stands on its own
        return ""
    group = q.shape[1] // k.shape[1]
    wrong = []
    for h in range(q.shape[1]):
        for j in (j for j in range(k.shape[1]) if j != h // group):  # the other KV heads
            ref, _ = reference_attention(q[:, h:h + 1], k[:, j:j + 1], v[:, j:j + 1], causal=True)
            if testing.mismatch("O", out[:, h:h + 1], ref, **testing.TOLERANCES[q.dtype]) is None:
                wrong.append(f"{h} read {j}")
    if not wrong:
        return ""
    return (f"wrong KV head: query head {', '.join(wrong)}; {k.shape[1]} KV heads each serve {group} neighbouring "
            f"query heads (0-{group - 1} share KV head 0). ")


LAYOUT_CASES = [  # (Q and K's layout, V's layout, dtype, batch, N)
    ("contiguous", "bnhd", F16, 1, 33),
    ("contiguous", "padded", F32, 2, 20),
    ("bnhd", "strided", F32, 1, 35),
    ("strided", "contiguous", F16, 2, 22),
]


@pytest.mark.points(6)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout,v_layout,dtype,batch,seq_len", LAYOUT_CASES,
                         ids=[f"{c[0]}-v_{c[1]}" for c in LAYOUT_CASES])
def test_forward_layouts(seed, layout, v_layout, dtype, batch, seq_len):
    # bnhd: a [B, N, H, D] tensor transposed; strided: every dimension strided, the head dim included;
    # padded: the first D columns of a wider tensor, NaN past them. V is never laid out as K is: a
    # kernel that reads V with K's strides reads the wrong numbers.
    check(seed, dtype=dtype, layout=layout, v_layout=v_layout, batch=batch, n_q_heads=4, n_kv_heads=2,
          seq_len=seq_len, head_dim=24)


RAGGED_CASES = [  # (N, Hq, Hkv, D, dtype, V's layout): K contiguous
    (17, 4, 2, 48, F32, "bnhd"),
    (39, 4, 2, 24, F16, "strided"),
    (63, 4, 2, 48, F16, "padded"),
    (100, 2, 1, 24, F32, "bnhd"),
]


@pytest.mark.points(6)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", RAGGED_CASES, ids=[f"n{c[0]}" for c in RAGGED_CASES])
def test_forward_ragged_lengths(seed, case):
    # Sequence lengths that are not a multiple of the tiles: the last query tile and the last key
    # block are partly padding, which must be masked.
    seq_len, n_q_heads, n_kv_heads, head_dim, dtype, v_layout = case
    check(seed, dtype=dtype, v_layout=v_layout, batch=2, n_q_heads=n_q_heads, n_kv_heads=n_kv_heads,
          seq_len=seq_len, head_dim=head_dim)


DTYPE_CASES = [  # (dtype, D, sm_scale, K's layout, V's layout)
    (F16, 64, None, "contiguous", "strided"),
    (F32, 80, 0.05, "contiguous", "bnhd"),
    (F16, 96, None, "bnhd", "padded"),
    (F32, 40, 0.5, "strided", "contiguous"),
]


@pytest.mark.points(6)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", DTYPE_CASES, ids=[f"{str(c[0])[6:]}-d{c[1]}" for c in DTYPE_CASES])
def test_forward_dtypes_head_dims_and_scales(seed, case):
    # 40, 80 and 96 are not powers of two: padded to 64 and 128 inside the kernel, and the padding
    # columns must read 0. fp16 multiplies in fp16 with fp32 sums; a chosen sm_scale replaces 1/sqrt(D).
    dtype, head_dim, sm_scale, layout, v_layout = case
    check(seed, sm_scale=sm_scale, dtype=dtype, layout=layout, v_layout=v_layout, batch=2, n_q_heads=4,
          n_kv_heads=2, seq_len=41, head_dim=head_dim)


LSE_CASES = [  # (Hq, Hkv, batch, N, D, dtype, K's layout, V's layout)
    (8, 2, 2, 29, 24, F32, "contiguous", "bnhd"),
    (6, 2, 2, 45, 80, F16, "strided", "padded"),
]


@pytest.mark.points(8)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", LSE_CASES, ids=[f"{c[0]}:{c[1]}-n{c[3]}" for c in LSE_CASES])
def test_forward_lse_natural_log(seed, case):
    # The LSE (the other tests judge O alone): LSE = log(sum_j exp(scaled score_ij)), the natural log (the
    # kernel works in base 2), with the max carried, float32, [B, Hq, N]. Two batches, grouped heads and a
    # ragged last tile: each row's LSE must land in its own batch, head and row.
    check(seed, lse=True, **case_inputs(case))


# --- corner cases: 8 points -------------------------------------------------------------------------------


@pytest.mark.points(1)
@pytest.mark.timeout(120)
def test_forward_one_token(seed):
    check(seed, batch=2, n_q_heads=4, n_kv_heads=2, seq_len=1, head_dim=16)


@pytest.mark.points(2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("causal", [True, False])
def test_forward_peaked_scores(seed, causal):
    # Sharply peaked attention: the scores of the first 64 keys are about 200
    # above all later ones. The running max must never fall (exp2 of a
    # rescale factor of 2^288 overflows).
    check(seed, causal=(causal,), qkv=peaked_qkv(seed=seed, block=64))


@pytest.mark.points(1)
@pytest.mark.timeout(120)
def test_forward_head_dim_256(seed):
    check(seed, batch=1, n_q_heads=2, n_kv_heads=1, seq_len=40, head_dim=256)


@pytest.mark.points(2)
@pytest.mark.timeout(180)
def test_forward_causal_skips_key_blocks_past_the_diagonal(seed):
    # The point of the two-phase key loop: a causal query tile never loads a
    # key block after its diagonal. The interpreter counts each program's
    # score tiles (tl.dot of Q with a K tile); a loop that runs on to SEQ_LEN
    # and lets the mask hide the future is right but does twice the work.
    seq_len = 100
    counts, config = student().score_tiles(seq_len=seq_len, head_dim=32, causal=True, seed=seed)
    block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    assert counts, ("no score tile was seen: compute each key block's scores with tl.dot of the Q tile and "
                    f"the K tile (a [{block_m}, {block_n}] tile)")
    for program, got in counts.items():
        q_tile = int(program.split(",")[0])
        need = tile_counts.key_blocks_needed(q_tile, seq_len, block_m, block_n)
        assert got <= need, (
            f"query tile {q_tile} (rows {q_tile * block_m}..{min((q_tile + 1) * block_m, seq_len) - 1}, "
            f"SEQ_LEN {seq_len}, BLOCK_M {block_m}, BLOCK_N {block_n}) computed {got} score tiles where the "
            f"causal walk needs {need}: key blocks past the diagonal must be skipped, never loaded")
    # Every program computed scores (a program that computed none would not be counted at all).
    assert len(counts) == -(-seq_len // block_m) * 2, f"programs that computed no score tile: {counts}"


def _assert_no_problem(problem):
    assert problem is None or isinstance(problem, dict), f"a probe's answer must be a problem or None, got {problem!r}"
    assert problem is None, f"{problem['message']}: {problem['where']}; {problem['cause']}"


@pytest.mark.points(1)
@pytest.mark.timeout(120)
def test_forward_masked_loads_read_zero():
    # Part 2 alone, in the interpreter, with a masked load that has no `other` reading NaN in its
    # masked lanes, as a GPU may (the interpreter itself reads 0 there): the ragged rows and the
    # padded head-dim columns of a tile must read 0.
    _assert_no_problem(student().probe("gqa_flash.course.lab.checks.kernel_walk:load_tile_masked_lanes_problem"))


@pytest.mark.points(1)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("part", ["load_tile", "epilogue"])
def test_forward_offsets_in_int64(part):
    # Parts 2 and 6 alone, in the interpreter, with loads and stores recorded instead of made: at
    # batch 2 (or head 3) of a tensor whose batch (or head) stride is just under 2^30 elements, the
    # addresses must be the 64-bit ones. An offset computed in int32 wraps past 2^31 elements.
    module = "kernel_walk" if part == "load_tile" else "kernel_parts"
    _assert_no_problem(student().probe(f"gqa_flash.course.lab.checks.{module}:{part}_offsets_problem"))
