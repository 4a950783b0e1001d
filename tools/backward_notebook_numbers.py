"""Notebook 06's measured numbers: the backward's H200 measurements (the topics "backward_dq_modes",
"backward_dq_add" and "backward_split" of notebooks/data/INDEX.csv) and the tiny model's training (the topic
"tiny_model_training"), each number the text quotes computed from those files into NUM, with asserts on the
words around them. Imported by tools/make_backward_notebook.py, which fills each <<name>> of its cells from NUM.
"""

from gqa_flash.course.lab import results

problems = results.unindexed()
assert not problems, "notebooks/data and INDEX.csv disagree:\n" + "\n".join(problems)
DQ_MODES = results.load("backward_dq_modes")
BWD = {(r["provider"], int(r["head_dim"]), int(r["seq_len"])): float(r["tflops"]) for r in DQ_MODES}
RATIO = {(r["provider"], int(r["head_dim"]), int(r["seq_len"])): float(r["ratio_to_sdpa"]) for r in DQ_MODES}
SHAPES = sorted({(d, n) for _, d, n in BWD})


def ratio(provider, d, n):
    """The CSV's ratio to SDPA's default (as docs/performance.md quotes it), not a quotient of rounded TFLOP/s."""
    return RATIO[(provider, d, n)]


LONG = [(d, n) for d, n in SHAPES if n >= 4096]
NUM = dict(
    file=f"`{results.path('backward_dq_modes').name}`",
    dq_file=f"`{results.path('backward_dq_add').name}`",
    g64_1k=results.two(ratio("graded", 64, 1024)), g128_1k=results.two(ratio("graded", 128, 1024)),
    g_long=results.span([ratio("graded", d, n) for d, n in LONG]),
    g_long_tf=results.span([BWD[("graded", d, n)] for d, n in LONG], "{:.0f}"),
    sdpa_long_tf=results.span([BWD[("sdpa_default", d, n)] for d, n in LONG], "{:.0f}"),
    a128=results.span([ratio("fast_atomic", 128, n) for n in (1024, 4096, 16384)]),
    a64_16k=results.two(ratio("fast_atomic", 64, 16384)),
    s64_long=results.span([ratio("fast_separate", 64, n) for n in (4096, 16384)]),
    s128_long=results.span([ratio("fast_separate", 128, n) for n in (4096, 16384)]),
    s64_1k=results.two(ratio("fast_separate", 64, 1024)), s128_1k=results.two(ratio("fast_separate", 128, 1024)),
)
# The words below: one pass (atomics) loses to the graded kernel at 128 and is ahead at 64 from 4k; two passes
# beat one everywhere and the graded kernel everywhere but head_dim 128 at 1k.
assert all(ratio("fast_atomic", 128, n) < ratio("graded", 128, n) for n in (1024, 4096, 16384))
assert all(ratio("fast_atomic", 64, n) > ratio("graded", 64, n) for n in (4096, 16384))
assert all(ratio("fast_separate", d, n) > ratio("fast_atomic", d, n) for d, n in SHAPES)
assert [s for s in SHAPES if ratio("fast_separate", *s) < ratio("graded", *s)] == [(128, 1024)]
# The bulk dQ add (TMA reduction) against per-element atomics, from its log.
dq = {}
for line in results.load("backward_dq_add").read_text().splitlines():
    parts = line.split()
    if "TFLOP/s" in parts and parts[5].startswith("fast_64x128_w8_s2_"):
        dq[(parts[5].rsplit("_", 1)[1], int(parts[2]), int(parts[4]))] = float(parts[8])
NUM["bulk_loss"] = results.span([100 * (1 - dq[("bulk", 64, n)] / dq[("atomic", 64, n)]) for n in (1024, 4096, 16384)], "{:.0f}")
oor = next(line for line in results.load("backward_dq_add").read_text().splitlines()
           if "fast_64x128_w8_s2_bulk: OutOfResources" in line and "d=128" in line)
NUM["smem_need"], NUM["smem_max"] = (f"{int(oor.split(key)[1].split(',')[0].split('.')[0]):,}"
                                     for key in ("Required: ", "Hardware limit: "))

# Where the fast backward's time goes: each kernel's CUDA time (torch.profiler), topic "backward_split".
# That file (code of 5386c38) names the kernels bare and has a _delta_kernel row; explore_fast.py's split
# now writes "fast ..." and "graded ..." rows, and two passes have no D kernel since 6f46ebf (D is computed
# in the dQ pass): pointing the topic at a newer file needs these names changed below.
SPLIT = {(int(r["d"]), int(r["n"]), r["provider"]): float(r["ms"]) for r in results.load("backward_split")}
SPLIT_SHAPES = sorted({(d, n) for d, n, _ in SPLIT})


def pass_rate(d, n, kernel, products):
    """A pass's own TFLOP/s: `products` matrix products a tile, the forward's two being 4*B*Hq*N^2*D/2."""
    return products / 2 * 4 * (16384 // n) * 32 * n * n * d / 2 / SPLIT[(d, n, kernel)] * 1e-9


SPLIT_LONG = [(d, n) for d, n in SPLIT_SHAPES if n >= 4096]
NUM.update(
    split_file=f"`{results.path('backward_split').name}`",
    kv_rate=results.span([pass_rate(d, n, "_fast_backward_kernel", 4) for d, n in SPLIT_LONG], "{:.0f}"),
    dq_rate=results.span([pass_rate(d, n, "_fast_dq_kernel", 3) for d, n in SPLIT_LONG], "{:.0f}"),
    sdpa_rate=results.span([2.5 * 4 * (16384 // n) * 32 * n * n * d / 2 / SPLIT[(d, n, "sdpa_default")] * 1e-9
                    for d, n in SPLIT_LONG], "{:.0f}"),
    kv_share=results.span([100 * SPLIT[(d, n, "_fast_backward_kernel")] / sum(
        SPLIT[(d, n, k)] for k in ("_fast_backward_kernel", "_fast_dq_kernel", "_delta_kernel"))
        for d, n in SPLIT_SHAPES], "{:.0f}"),
)
NUM["split_gap"] = f"{max(abs(SPLIT[(d, n, 'fast_total')] / sum(SPLIT[(d, n, k)] for k in ('_fast_backward_kernel', '_fast_dq_kernel', '_delta_kernel')) - 1) for d, n in SPLIT_SHAPES) * 100:.0f}"
# The words: the dQ pass is faster per product than the dK/dV pass at every shape, and the dK/dV pass
# takes more than half of the kernels' time everywhere.
assert all(pass_rate(d, n, "_fast_dq_kernel", 3) > pass_rate(d, n, "_fast_backward_kernel", 4)
           for d, n in SPLIT_SHAPES)
assert all(2 * SPLIT[(d, n, "_fast_backward_kernel")] > SPLIT[(d, n, "_fast_backward_kernel")]
           + SPLIT[(d, n, "_fast_dq_kernel")] + SPLIT[(d, n, "_delta_kernel")] for d, n in SPLIT_SHAPES)

# The tiny model trained on the H200 with three attentions: {provider: [rows by step]}.
TRAIN_TOPIC = "tiny_model_training"
CURVES = {}
for r in results.load(TRAIN_TOPIC):
    CURVES.setdefault(r["provider"], []).append(r)
assert list(CURVES) == ["sdpa", "course_graded", "course_fast"], list(CURVES)
assert "512 held-out" in results.entry(TRAIN_TOPIC)["what"], "the text says 512 held-out sequences"
STEPS = [int(r["step"]) for r in CURVES["sdpa"]]
assert all([int(r["step"]) for r in rows] == STEPS for rows in CURVES.values())
FIRST = CURVES["sdpa"][0]
assert {r["dtype"] for rows in CURVES.values() for r in rows} == {"float32"}, "the text says fp32"


def _column(provider, column):
    return [float(r[column]) for r in CURVES[provider]]


def _agree(i):  # the three training losses equal when rounded to 3 decimals
    return len({round(_column(p, "train_loss")[i], 3) for p in CURVES}) == 1


agree = next(i for i in range(len(STEPS)) if not _agree(i)) - 1
assert agree >= 0 and not any(_agree(i) for i in range(agree + 1, agree + 3))
same = next(i for i in range(len(STEPS)) if len({_column(p, "sequence_accuracy")[i] for p in CURVES}) > 1) - 1
assert 0 <= same <= agree
final = {p: _column(p, "sequence_accuracy")[-1] for p in CURVES}
best = {p: max(_column(p, "sequence_accuracy")) for p in CURVES}
assert min(best.values()) >= 0.99, best
later = {p: min(_column(p, "sequence_accuracy")[agree + 1:]) for p in CURVES}
dip = min(later, key=later.get)
NUM.update(
    train_file=f"`{results.path(TRAIN_TOPIC).name}`", train_steps=str(STEPS[-1]), train_batch=FIRST["batch"],
    train_digits=FIRST["digits"], train_dim=FIRST["model_dim"], agree_step=str(STEPS[agree]),
    same_step=str(STEPS[same]), same_seq=f"{_column('sdpa', 'sequence_accuracy')[same]:.3f}",
    part_step=str(STEPS[agree + 1]),
    part_loss=results.span([_column(p, "train_loss")[agree + 1] for p in CURVES], "{:.3f}"),
    final_sdpa=f"{final['sdpa']:.3f}", final_graded=f"{final['course_graded']:.3f}",
    final_fast=f"{final['course_fast']:.3f}", best_min=f"{min(best.values()):.3f}",
    dip_who={"sdpa": "SDPA's", "course_graded": "the graded kernels'", "course_fast": "the fast kernels'"}[dip],
    dip_acc=f"{later[dip]:.2f}", dip_step=str(STEPS[_column(dip, "sequence_accuracy").index(later[dip])]),
)
assert final["course_graded"] < 0.9 < final["sdpa"] and final["course_fast"] > 0.99, final

# The training runs. cpu_seconds: time.process_time of the CPU run of train(course_attention) with the solutions, one
# thread, where the notebook ran (4.1-6.2 s); 16 steps of 4 took 18 s there, 15-61 s on laptops (issue 47).
NUM.update({k: str(v) for k, v in dict(gpu_steps=300, gpu_batch=64, cpu_steps=10, cpu_batch=2, cpu_seconds=5).items()})
