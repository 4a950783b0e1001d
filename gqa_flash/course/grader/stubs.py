"""The stubs a student receives, written from the course's completed files (the implementation switch,
:mod:`gqa_flash.course.impl`, says where those are). The maintainers' release tool writes them into
``gqa_flash/``; the grader computes them to tell a module not started.

The completed files are the single source of truth. In each, every piece a student writes sits inside the
seed's banner, between markers (their exact text is the constants BEGIN, STUB and END below; this package
never spells them out, so that a search for them in ``gqa_flash/`` finds nothing unless an answer leaked)::

    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 2) ---
    # what to compute and why ...
    <BEGIN marker>
    <the answer>
    <STUB marker>
    # <the stub, commented out here, uncommented in the student file>
    <END marker>
    # --- END OF STUDENT IMPLEMENTATION ---

The student file gets everything but the answer: the lines between the BEGIN marker and the STUB (or END)
marker are dropped, and the stub takes their place. Without a STUB section the stub is
``raise NotImplementedError("Part N of <module>.py is not implemented yet")``; Triton kernels need an
explicit stub, since ``raise`` does not compile there. Markers that nest, that never end, that stand outside a
banner, or that still appear in a student file are errors with file and line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gqa_flash.course import impl, layout
from gqa_flash.course.layout import BANNER, BANNER_END

# Spelled in two pieces so that this file never contains the markers themselves.
BEGIN = "### BEGIN " + "SOLUTION"
STUB = "### " + "STUB"
END = "### END " + "SOLUTION"
COMPLETED_DIR = impl.SOLUTIONS_DIR  # the switch's
STUDENT_DIR = layout.PACKAGE_DIR

HEADER = (
    "# Your file: fill in the STUDENT IMPLEMENTATION sections; leave the rest as it is.\n"
    "# (Written from the course's completed {name} by its release tool.)\n"
)


class MarkerError(ValueError):
    """A solution file whose markers are malformed; the message names file and line."""


@dataclass
class _Region:
    part: str
    begin_line: int
    indent: str
    stub: list[str] | None = None


def strip_answers(text: str, filename: str = "<string>") -> str:
    """The student version of one solution file's text."""
    out: list[str] = []
    banner_part: str | None = None
    banner_line = 0
    region: _Region | None = None
    in_stub = False
    lines = text.splitlines(keepends=True)

    def err(lineno: int, msg: str) -> MarkerError:
        return MarkerError(f"{filename}:{lineno}: {msg}")

    for lineno, line in enumerate(lines, start=1):
        stripped = line.strip()
        m = BANNER.search(stripped)
        if m and stripped.startswith("#"):
            if region is not None:
                raise err(lineno, f"banner inside the solution region opened at line {region.begin_line}")
            if banner_part is not None:
                raise err(lineno, f"a new banner before the end of the Part {banner_part} banner of line {banner_line}")
            banner_part, banner_line = m.group(1), lineno
            out.append(line)
            continue
        if stripped == BANNER_END:
            if region is not None:
                raise err(lineno, f"end of banner inside the solution region opened at line {region.begin_line}")
            if banner_part is None:
                raise err(lineno, "end of banner without a STUDENT IMPLEMENTATION banner before it")
            banner_part = None
            out.append(line)
            continue
        if stripped.startswith("###") and stripped not in (BEGIN, STUB, END) and (
            "SOLUTION" in stripped or "STUB" in stripped
        ):
            raise err(lineno, f"unknown marker {stripped!r}; expected {BEGIN!r}, {STUB!r} or {END!r}")
        if stripped == BEGIN:
            if region is not None:
                raise err(lineno, f"nested {BEGIN!r}: the region opened at line {region.begin_line} has not ended")
            if banner_part is None:
                raise err(lineno, f"{BEGIN!r} outside a STUDENT IMPLEMENTATION banner")
            region = _Region(part=banner_part, begin_line=lineno, indent=line[: len(line) - len(line.lstrip())])
            in_stub = False
            continue
        if stripped == STUB:
            if region is None:
                raise err(lineno, f"{STUB!r} outside a solution region")
            if in_stub:
                raise err(lineno, f"a second {STUB!r} in the region opened at line {region.begin_line}")
            in_stub, region.stub = True, []
            continue
        if stripped == END:
            if region is None:
                raise err(lineno, f"{END!r} without a {BEGIN!r} before it")
            out.extend(_stub_lines(region, filename))
            region, in_stub = None, False
            continue
        if region is None:
            out.append(line)
        elif in_stub:
            region.stub.append(_uncomment(line, region, filename, lineno))
        # else: a solution line, dropped
    if region is not None:
        raise err(region.begin_line, f"{BEGIN!r} is never closed by {END!r}")
    if banner_part is not None:
        raise err(banner_line, f"the Part {banner_part} banner is never closed by {BANNER_END!r}")
    return "".join(out)


def _uncomment(line: str, region: _Region, filename: str, lineno: int) -> str:
    """Stub lines are commented out in the solution file: '<indent># code' -> '<indent>code'."""
    body = line.rstrip("\n")
    if not body.strip():
        return "\n"
    if not body.startswith(region.indent + "#"):
        raise MarkerError(
            f"{filename}:{lineno}: stub lines must be commented out at the marker's indentation "
            f"({region.indent!r} + '# '), got {body!r}"
        )
    rest = body[len(region.indent) + 1 :]
    return region.indent + (rest[1:] if rest.startswith(" ") else rest) + "\n"


def _stub_lines(region: _Region, filename: str) -> list[str]:
    if region.stub is not None:
        return region.stub
    module = Path(filename).name
    return [f'{region.indent}raise NotImplementedError("Part {region.part} of {module} is not implemented yet")\n']


def solution_lines(text: str) -> dict[str, list[str]]:
    """The code lines of each part's solution regions (comments and blank lines left out), by part.

    What a student writes, measured: the course asks for a real kernel, and a
    test (tests/course/test_release.py) holds these counts to a floor. The lines also
    serve the leak check: none of them may appear in anything a student gets.
    """
    parts: dict[str, list[str]] = {}
    part, inside = None, False
    for line in text.splitlines():
        stripped = line.strip()
        m = BANNER.search(stripped)
        if m and stripped.startswith("#"):
            part = m.group(1)
        elif stripped == BEGIN:
            inside = True
        elif stripped in (STUB, END):
            inside = False
        elif inside and stripped and not stripped.startswith("#"):
            parts.setdefault(part, []).append(stripped)
    return parts


def signpost(module: str) -> str:
    """The comment block under a stub's header: what the file is measured against, and how."""
    info = layout.STUDENT_FILES.get(module)
    if info is None:
        return ""
    spec = f"gqa_flash/{info.spec.replace('.', '.py: ', 1)}" if info.spec.startswith("reference.") else info.spec
    lines = [f"#   specification  {spec}",
             f"#   notebook       notebooks/{info.notebook}.ipynb, checked by checks.{info.check}()"]
    if info.points:
        bonus = ", a bonus on top of the 100" if module in layout.BONUS_MODULES else ""
        lines += [f"#   graded by      tests/graded/test_{module}.py: {info.points} points{bonus}",
                  f"#   run them       make test-graded MODULE={module}"]
    else:
        lines.append("#   graded by      nothing: a practice file")
    return "#\n" + "\n".join(lines) + "\n"


def student_text(solution_path: Path) -> str:
    body = strip_answers(solution_path.read_text(), str(solution_path))
    text = HEADER.format(name=solution_path.name) + signpost(solution_path.stem) + body
    for marker in (BEGIN, STUB, END):
        if marker in text:  # belt and braces: no solution marker ever reaches a student file
            raise MarkerError(f"{solution_path}: {marker!r} would reach the student file")
    return text


def plan(completed_dir: Path = COMPLETED_DIR, student_dir: Path = STUDENT_DIR) -> dict[Path, str]:
    """The student files to write: {path in student_dir: text}, from the completed files in completed_dir."""
    files = sorted(p for p in completed_dir.glob("*.py") if not p.name.startswith("_"))
    if not files:
        raise FileNotFoundError(f"no completed files in {completed_dir}")
    return {student_dir / p.name: student_text(p) for p in files}
