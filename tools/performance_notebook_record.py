"""The record behind notebook 05's section 5, written into docs/performance.md (tools/make_performance_notebook.py).

The notebook tells the story of the fast forward kernel in one summary table, and of the Gluon kernel in
another; the tables behind them (each fixed tile at every shape, each step of the Gluon kernel at both head
dims) are a lab's record, not a lesson. This module writes them, from the same files (read by topic,
notebooks/data/INDEX.csv), between two markers at the end of docs/performance.md: a regeneration replaces
that section and leaves the rest of the page alone.
"""
from pathlib import Path

import performance_notebook_fast as fast_section  # tools/: explore_table, sdpa_tflops
from gqa_flash.course.lab import results

COURSE = Path(__file__).resolve().parent.parent
DOCS = COURSE / "docs" / "performance.md"
BEGIN = "<!-- notebook-05-record: written by tools/make_performance_notebook.py from notebooks/data; edit there -->"
END = "<!-- /notebook-05-record -->"


def table(header, rows) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def source(topic) -> str:
    """Where a table's numbers come from: the file, its date and GPU."""
    row = results.entry(topic)
    return f"`{results.path(topic).relative_to(COURSE).as_posix()}`, {row['date']}, {row['gpu']}"


def _shape(d, n):
    return f"D{d} N={n // 1024}k"


def _fixed_tiles(topic, names):
    ratio = fast_section.explore_table(topic)
    shapes = sorted({(d, n) for _, d, n in ratio})
    rows = []
    for p in names:
        label = p[5:] if "sub2" in p or "lazy" in p else p[5:] + "_sub1"
        rows.append([f"`{label}`"] + [results.two(ratio[(p, d, n)]) if (p, d, n) in ratio else "-" for d, n in shapes])
    return table(["fast kernel, fixed tile"] + [_shape(d, n) for d, n in shapes], rows)


def sdpa_speeds() -> str:
    rows = [[f"`{t}`", f"`{results.path(t).name}`", f"{fast_section.sdpa_tflops(t):.1f}"]
            for t in fast_section.SPREAD_TOPICS]
    return table(["topic", "file", "SDPA default, TFLOP/s at D128, N = 16k"], rows)


def descriptors() -> str:
    first = {(int(r["head_dim"]), int(r["seq_len"])): float(r["ratio_to_sdpa_default"])
             for r in results.load("forward_first") if r["provider"] == "course_fast"}
    later = fast_section.explore_table("fast_forward_tiles")
    shapes = sorted({(d, n) for _, d, n in later})
    rows = [[d, n, results.two(later[("graded_autotuned", d, n)]), results.two(first[(d, n)]),
             results.two(later[("fast_autotuned", d, n)])] for d, n in shapes]
    return table(["D", "N", "graded", "fast, descriptors in the kernel", "fast, descriptors on the host"], rows)


def warp_specialised() -> str:
    later = fast_section.explore_table("fast_forward_tiles")
    names = sorted({p for p, _, _ in later if p.startswith("fast_1")}, key=lambda p: (p.replace("_ws", ""), p))
    shapes = sorted({(d, n) for _, d, n in later})
    rows = [[f"`{p[5:]}`"] + [results.two(later[(p, d, n)]) if (p, d, n) in later else "-" for d, n in shapes]
            for p in names]
    return table(["fast kernel, fixed tile"] + [_shape(d, n) for d, n in shapes], rows)


def hopper_steps(steps, d) -> str:
    """One row per kernel of each Gluon step's run, at head_dim d (`*`: the fast kernel ran the Gluon kernel)."""
    def ratios(topic, provider):
        return {int(r["seq_len"]): (float(r["ratio_to_sdpa_default"]), r["tiles"]) for r in results.load(topic)
                if r["part"] == "time" and r["provider"] == provider and int(r["head_dim"]) == d}

    lens = sorted(ratios(steps[-1][0], "gluon"))
    rows = []
    for topic, step, providers in steps:
        for i, (provider, label) in enumerate(providers + [("course_fast", "fast kernel (Triton; *Gluon)")]):
            got = ratios(topic, provider)
            cells = [results.two(got[n][0]) + ("*" if provider == "course_fast" and got[n][1].startswith("gluon")
                                               else "") for n in lens]
            rows.append([step if i == 0 else "", label] + cells)
    return table(["step", "kernel"] + [f"N={n // 1024}k" for n in lens], rows)


def section(fill, hopper) -> str:
    """The record's markdown, between the markers; ``fill`` puts in the generator's numbers and file names,
    ``hopper`` is tools/performance_notebook_hopper.py (its steps and its detailed account)."""
    checks = []
    for topic, step, _ in hopper.STEPS:
        rows = [r for r in results.load(topic) if r["part"] == "check"]
        checks.append(f"- step {step[:1]}: {source(topic)}; {sum(r['verdict'] == 'ok' for r in rows)} of "
                      f"{len(rows)} float64 checks ok")
    parts = [
        BEGIN,
        "## Notebook 05's record: the forward kernels, table by table",
        "Notebook 05 (section 5) sums up what each change to the fast forward kernel bought, and what each step "
        "of the Gluon kernel bought, in two short tables. These are the tables behind them, written by "
        "`tools/make_performance_notebook.py` from the files named under each. Every value is a ratio to "
        "SDPA's default backend timed in the same run (1.00 is a tie; bf16, causal, 32 query heads on 8 KV "
        "heads, 16k tokens a launch), so compare within one table.",
        "### SDPA's own speed, file by file",
        "Between runs the machine changes: SDPA's default at head_dim 128, N = 16k, in each file of the fast "
        "kernel's story (all on the " + fill("<<gpu>>") + "):",
        sdpa_speeds(),
        "### Descriptors in the kernel, then on the host",
        fill("The first fast kernel made its tensor descriptors inside the kernel (<<file:forward_first>>); the "
             "next one built them on the host (<<file:fast_forward_tiles>>, autotuned, beside the graded kernel), "
             "each column against SDPA in its own file:"),
        descriptors(),
        fill("The fast kernel at fixed tiles, with and without the warp-specialised key loop, `_ws` ("
             + source("fast_forward_tiles") + "):"),
        warp_specialised(),
        "### Two query sub-tiles",
        fill("Plain tiles (`sub1`) and tiles split into two query sub-tiles (`sub2`), the first half leaving "
             "the diagonal early (" + source("fast_subtiles") + "):"),
        _fixed_tiles("fast_subtiles", ["fast_128x128_w8_s3", "fast_128x64_w8_s3", "fast_64x64_w4_s3",
                                       "fast_256x64_w8_s3_sub2", "fast_256x64_w8_s3_ws_sub2",
                                       "fast_128x64_w4_s3_sub2", "fast_128x64_w4_s2_sub2"]),
        "### The first sub-tiles, a 256-row tile without the split, and lazy rescaling",
        "The first version of the sub-tiles (both halves walk the whole diagonal), a 256-row tile without the "
        "split, and lazy rescaling beside the same tiles without it (" + source("lazy_rescaling")
        + "). The run had its own SDPA baseline, so its plain tiles' ratios differ a little from the table above:",
        _fixed_tiles("lazy_rescaling", ["fast_128x128_w8_s3", "fast_128x128_w8_s3_lazy", "fast_128x64_w8_s3",
                                        "fast_128x64_w8_s3_lazy", "fast_256x64_w8_s3", "fast_256x64_w8_s3_sub2",
                                        "fast_256x64_w8_s3_sub2_lazy", "fast_128x64_w4_s3_sub2",
                                        "fast_128x64_w4_s3_sub2_lazy"]),
        "### The Gluon kernel, step by step",
        fill("Each step was one device call on an <<hopper_gpu>>, 5 interleaved rounds, every variant checked "
             "against float64 first. Each step's run timed the fast kernel beside the Gluon variants; `*` marks "
             "where the fast kernel's route of that day ran the Gluon kernel."),
        "\n".join(checks),
        "Head_dim 128:",
        hopper_steps(hopper.STEPS, 128),
        "Head_dim 64:",
        hopper_steps(hopper.STEPS, 64),
        fill(hopper.DETAIL.strip()),
        END,
    ]
    return "\n\n".join(parts) + "\n"


def updated(text, record) -> str:
    """docs/performance.md's text with the record put in: between the markers, or appended at the end."""
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        if END not in rest:
            raise ValueError(f"{DOCS}: {BEGIN!r} without {END!r}")
        return head + record.rstrip("\n") + rest.split(END, 1)[1]
    return text.rstrip("\n") + "\n\n" + record
