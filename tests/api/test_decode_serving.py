"""flash_decode as a serving loop calls it: ``max_seqlen`` given, new tokens appended, no value trusted.

On a CPU, in the interpreter (the CUDA-graph capture and replay are in tests/gpu/test_gpu_decode.py):

* with ``max_seqlen`` the answers are those of the checked path, and the call reads nothing of
  ``cache_seqlens`` or ``block_table`` on the host, with host work that does not grow with the batch;
* ``k_new``/``v_new`` land where writing the cache by hand puts them, contiguous and paged;
* lengths past the cache, negative ones and pages outside the pool make no kernel read or write
  outside its tensors (the address check of gqa_flash.course.address_check), and the sequences whose values
  are right still get their right rows;
* what the fast path cannot check is refused by type and shape, with the argument named.
"""

import pytest
import torch
from torch.overrides import TorchFunctionMode

import gqa_flash
from gqa_flash.course import decode_launch, impl, kv_cache
from gqa_flash.course.address_check import checked_addresses
from gqa_flash.reference import reference_decode
from gqa_flash.course.testing import assert_matches, decode_inputs

CAPACITY, PAGE = 64, 16


def _inputs(seed, paged, batch=3, n_new=2, seqlens=(2, 30, 61), capacity=CAPACITY):
    return decode_inputs(seed, batch=batch, n_q_heads=4, n_kv_heads=2, n_new=n_new, head_dim=32, seqlens=seqlens,
                         capacity=capacity, page_size=PAGE if paged else None, dtype=torch.float32)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("bound", ["longest", "capacity"])
def test_max_seqlen_gives_the_checked_answer(paged, bound, seed):
    q, k, v, seqlens, table = _inputs(seed, paged)
    max_seqlen = 61 if bound == "longest" else CAPACITY
    ref, ref_lse = reference_decode(q, k, v, seqlens, table)
    o, lse = gqa_flash.flash_decode(q, k, v, seqlens, block_table=table, max_seqlen=max_seqlen, return_lse=True)
    assert_matches("O", o, ref, torch.float32, f"seed {seed}, max_seqlen {max_seqlen}")
    assert torch.allclose(lse.double(), ref_lse, atol=1e-4), f"seed {seed}: LSE"


class _HostReads(TorchFunctionMode):
    """Records every torch function and method called with one of ``watched`` among its arguments."""

    METADATA = {"__get__", "stride", "data_ptr", "dim", "size", "numel", "element_size", "is_contiguous",
                "storage_offset", "get_device"}

    def __init__(self, *watched):
        super().__init__()
        self.watched, self.calls = [id(t) for t in watched], []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if any(id(a) in self.watched for a in args):
            self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))

    def reads(self):
        return [name for name in self.calls if name not in self.METADATA]


class _NoLaunch:
    """Stands in for a @triton.jit kernel: ``kernel[grid](...)`` records the grid and runs nothing."""

    def __init__(self):
        self.grids = []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return lambda *args, **kwargs: None


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_max_seqlen_reads_nothing_on_the_host(paged, monkeypatch):
    """The API, the append and the launcher (its split heuristic included) only look at metadata of
    cache_seqlens and block_table; and what they do is the same at batch 2 and batch 6. A control: without
    max_seqlen the same probe sees the host read."""
    decode = impl.load("decode")
    for module, name in ((decode, "_flash_decode_split_kernel"), (decode, "_flash_decode_merge_kernel"),
                         (kv_cache, "_append_kernel")):
        monkeypatch.setattr(module, name, _NoLaunch())
    monkeypatch.setattr(decode_launch, "_plans", {})  # no plan of these stand-ins outlives the test
    seen = {}
    for batch in (2, 6):
        q, k, v, seqlens, table = _inputs(0, paged, batch=batch, seqlens=(40,) * batch)
        k_new, v_new = torch.zeros(batch, 2, 2, 32), torch.zeros(batch, 2, 2, 32)
        with _HostReads(seqlens, table) as probe:
            gqa_flash.flash_decode(q, k, v, seqlens, block_table=table, max_seqlen=CAPACITY, k_new=k_new,
                                   v_new=v_new, num_splits=3)
        assert probe.reads() == [], f"batch {batch}: host reads of cache_seqlens or block_table: {probe.reads()}"
        seen[batch] = probe.calls
    assert len(seen[2]) == len(seen[6]), f"host work grows with the batch: {seen}"
    with _HostReads(seqlens, table) as control:
        gqa_flash.flash_decode(q, k, v, seqlens, block_table=table, num_splits=3)
    assert "tolist" in control.reads(), f"the probe missed the checked path's read: {control.calls}"


def _by_hand(k_new, v_new, k, v, seqlens, table):
    """The cache after writing new token i of sequence b at position seqlens[b] - Nq + i, in PyTorch."""
    k, v = k.clone(), v.clone()
    n_new = k_new.shape[2]
    for b, n in enumerate(seqlens.tolist()):
        for i in range(n_new):
            pos = n - n_new + i
            if table is None:
                k[b, :, pos], v[b, :, pos] = k_new[b, :, i], v_new[b, :, i]
            else:
                page = int(table[b, pos // PAGE])
                k[page, pos % PAGE], v[page, pos % PAGE] = k_new[b, :, i], v_new[b, :, i]
    return k, v


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("max_seqlen", [None, CAPACITY], ids=["checked", "max_seqlen"])
def test_new_tokens_are_appended_before_attending(paged, max_seqlen, seed):
    q, k, v, seqlens, table = _inputs(seed, paged, n_new=3, seqlens=(3, 17, 64))
    gen = torch.Generator().manual_seed(seed + 1)
    # Strided views, as a model's fused QKV projection hands them over.
    k_new, v_new = (torch.randn(3, 3, 2, 32, generator=gen).transpose(1, 2) for _ in range(2))
    want_k, want_v = _by_hand(k_new, v_new, k, v, seqlens, table)
    ref, _ = reference_decode(q, want_k, want_v, seqlens, table)
    o = gqa_flash.flash_decode(q, k, v, seqlens, block_table=table, max_seqlen=max_seqlen, k_new=k_new, v_new=v_new)
    assert torch.equal(k.nan_to_num(7.0), want_k.nan_to_num(7.0)), f"seed {seed}: K cache differs from by hand"
    assert torch.equal(v.nan_to_num(7.0), want_v.nan_to_num(7.0)), f"seed {seed}: V cache differs from by hand"
    assert_matches("O", o, ref, torch.float32, f"seed {seed}: attention after the append")


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_bad_values_never_leave_the_tensors(paged, seed):
    """Sequence 0 is right; 1 (paged) names pages outside the pool; 2 is negative; 3, the last (its
    memory ends the tensor), is past the cache. The contiguous cache holds 50 positions, not a whole
    number of key blocks: the last block's loads reach past it unless the kernel clamps the length."""
    capacity = CAPACITY if paged else 50
    q, k, v, seqlens, table = _inputs(seed, paged, batch=4, seqlens=(33, 20, 20, 20), capacity=capacity)
    seqlens[2], seqlens[3] = -7, 10**6
    if paged:
        table[1, 0], table[1, 1] = 10**8, -5
    ref0, _ = reference_decode(q[:1], k[:1] if not paged else k, v[:1] if not paged else v, seqlens[:1],
                               None if table is None else table[:1])
    k_new, v_new = torch.ones(4, 2, 2, 32), torch.ones(4, 2, 2, 32)
    k_before = k.clone()
    with checked_addresses():
        o = gqa_flash.flash_decode(q, k, v, seqlens, block_table=table, max_seqlen=capacity)
        kv_cache.append(k_new, v_new, k, v, seqlens, table)  # lengths outside the cache: nothing written
    assert_matches("O of the sequence whose values are right", o[:1], ref0, torch.float32, f"seed {seed}")
    if paged:  # sequence 1's pages 0 and 1 are outside the pool; its length 20 falls on page 1
        unchanged = torch.ones(k.shape[0], dtype=torch.bool)
        unchanged[table[0, 32 // PAGE]] = False  # sequence 0's positions 31 and 32, on its pages 1 and 2
        unchanged[table[0, 31 // PAGE]] = False
    else:
        unchanged = torch.tensor([False, False, True, True])
    assert torch.equal(k[unchanged].nan_to_num(7.0), k_before[unchanged].nan_to_num(7.0)), \
        f"seed {seed}: an append with a bad length or page wrote into the cache"


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(max_seqlen=1.5), TypeError, "max_seqlen must be an int"),
    (dict(max_seqlen=True), TypeError, "max_seqlen must be an int"),
    (dict(max_seqlen=CAPACITY + 1), ValueError, "max_seqlen must lie between"),
    (dict(max_seqlen=0), ValueError, "max_seqlen must lie between"),
    (dict(k_new="K"), ValueError, "k_new and v_new come together"),
    (dict(k_new=torch.zeros(3, 2, 2, 32), v_new=torch.zeros(3, 2, 1, 32)), ValueError, "v_new must be [batch"),
    (dict(k_new=torch.zeros(3, 2, 2, 32, dtype=torch.float16), v_new=torch.zeros(3, 2, 2, 32)), TypeError,
     "k_new must have q's dtype"),
])
def test_serving_arguments_are_checked(kwargs, error, words):
    q, k, v, seqlens, table = _inputs(0, False)
    with pytest.raises(error, match=None) as info:
        gqa_flash.flash_decode(q, k, v, seqlens, **kwargs)
    assert words in str(info.value), str(info.value)


def test_a_signature_seen_before_is_served_by_its_plan_with_new_values(monkeypatch, seed):
    """The serving path checks and plans once per signature; a second call with the same shapes but new
    values (queries, cache, lengths, pages) skips both and must still give the new answer."""
    monkeypatch.setattr(decode_launch, "_plans", {})
    checks = []
    real_check = decode_launch.validation.check_decode_inputs
    monkeypatch.setattr(decode_launch.validation, "check_decode_inputs",
                        lambda *a, **kw: checks.append(1) or real_check(*a, **kw))
    for round_, lengths in enumerate([(2, 30, 61), (64, 5, 17)]):
        q, k, v, seqlens, table = _inputs(seed + round_, True, seqlens=lengths)
        ref, _ = reference_decode(q, k, v, seqlens, table)
        o = gqa_flash.flash_decode(q, k, v, seqlens, block_table=table, max_seqlen=CAPACITY)
        assert_matches("O", o, ref, torch.float32, f"seed {seed}, call {round_ + 1} (lengths {lengths})")
    assert len(checks) == 1 and len(decode_launch._plans) == 1, \
        f"two calls of one signature: {len(checks)} checks, {len(decode_launch._plans)} plans (want 1 and 1)"


@pytest.mark.parametrize("change", ["strides", "dtype", "alignment", "argument type", "kernel"])
def test_a_new_signature_gets_a_plan_of_its_own(change, monkeypatch, seed):
    """What the plan was made for is its key: queries with other strides, another dtype, an address of
    another alignment, max_seqlen of another type or a kernel edited and loaded again each miss the first
    plan (and are checked and answered afresh) instead of running a plan made for something else."""
    monkeypatch.setattr(decode_launch, "_plans", {})
    q, k, v, seqlens, table = _inputs(seed, False)
    gqa_flash.flash_decode(q, k, v, seqlens, max_seqlen=CAPACITY)
    if change == "argument type":  # served from max_seqlen=64, 64.0 would skip its check
        with pytest.raises(TypeError, match="max_seqlen must be an int"):
            gqa_flash.flash_decode(q, k, v, seqlens, max_seqlen=float(CAPACITY))
        return
    if change == "kernel":
        stand_in = _NoLaunch()
        monkeypatch.setattr(impl.load("decode"), "_flash_decode_split_kernel", stand_in)
        gqa_flash.flash_decode(q, k, v, seqlens, max_seqlen=CAPACITY)
        assert stand_in.grids, "the plan made for the kernel before the edit was used after it"
        return
    if change == "strides":
        q = q.transpose(1, 2).contiguous().transpose(1, 2)  # [B, Nq, Hq, D] memory, [B, Hq, Nq, D] view
    elif change == "dtype":
        q, k, v = q.half(), k.half(), v.half()
    else:  # the same queries one element into a larger buffer: 4 bytes off a 16-byte boundary
        q = torch.cat([torch.zeros(1), q.flatten()])[1:].view(q.shape)
    ref, _ = reference_decode(q, k, v, seqlens, None)
    o = gqa_flash.flash_decode(q, k, v, seqlens, max_seqlen=CAPACITY)
    assert_matches("O", o, ref, q.dtype, f"seed {seed}, after a change of {change}")
    assert len(decode_launch._plans) == 2, f"a change of {change} did not make a plan of its own"


@pytest.mark.parametrize("max_seqlen", [None, CAPACITY], ids=["checked", "max_seqlen"])
def test_an_empty_batch_gives_empty_outputs(max_seqlen):
    q, k, v, seqlens, _ = _inputs(0, False, batch=0, seqlens=())
    k_new = v_new = torch.zeros(0, 2, 2, 32)
    o, lse = gqa_flash.flash_decode(q, k, v, seqlens, max_seqlen=max_seqlen, return_lse=True, k_new=k_new,
                                    v_new=v_new)
    assert o.shape == q.shape and lse.shape == q.shape[:3], (o.shape, lse.shape)
