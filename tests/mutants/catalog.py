"""Classic student bugs, each a small edit of a solution file: the graded tests must catch every one.

A mutant is a solution with one bug put in (a few edits of its text, each
``old`` found exactly once). Each graded module's mutants live in a file of
their own (``naive.py``, ``forward.py``...); this module defines what a mutant
is and gathers them all in ``MUTANTS``, in course order. ``tests/grader/test_mutants.py`` grades each mutant on
the tests of the module it touches and asserts that it loses points there.

Every mutant costs one run of its module's tests (about 4 s for naive.py, 9 s
for forward.py here), so the catalog keeps one mutant per kind of bug and
module, not every variant.

A mutant that keeps all its points is a hole in the graded tests. It stays
here with ``survives`` saying why, and its test is an expected failure, until
a graded test catches it; then delete ``survives`` (the strict xfail turns
into a failure to remind you).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from gqa_flash.course import impl


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # the solution file it edits (solutions/<file>)
    edits: tuple[tuple[str, str], ...]  # (old, new), each old exactly once in the file
    bug: str  # the student's mistake, in words
    survives: str = ""  # why the graded tests miss it: a known hole
    loses: float = 0.0  # the fewest points of its module it must lose (points follow harm: docs/instructors.md,
    # "Grading")

    @property
    def module(self) -> str:
        return self.file.removesuffix(".py")

    def imported(self, folder: Path):
        """The mutated solution file, written to ``folder`` and imported as a module of its own (a file of its
        own: Triton reads the kernels' source from it)."""
        path = Path(folder) / f"{self.name}.py"
        path.write_text(self.apply((impl.SOLUTIONS_DIR / self.file).read_text()))
        spec = importlib.util.spec_from_file_location(f"mutant_{self.name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def apply(self, text: str) -> str:
        for old, new in self.edits:
            count = text.count(old)
            if count != 1:
                raise ValueError(f"mutant {self.name}: {old!r} occurs {count} times in {self.file}, not once")
            text = text.replace(old, new)
        return text


def serve(module, name: str, monkeypatch) -> None:
    """Make ``impl.load(name)`` (so the API and the notebook checks) give ``module``; the other files as usual."""
    real_load = impl.load
    monkeypatch.setattr(impl, "load",
                        lambda wanted, choice=None: module if wanted == name else real_load(wanted, choice))


def _m(name, file, bug, *edits, survives="", loses=0.0):
    return Mutant(name=name, file=file, edits=tuple(edits), bug=bug, survives=survives, loses=loses)



# The per-module lists import _m from here: gather them last.
from mutants import backward, decode, forward, naive, online_softmax, ring, tiled, windows  # noqa: E402

MUTANTS = [*naive.MUTANTS, *online_softmax.MUTANTS, *tiled.MUTANTS, *forward.MUTANTS, *windows.MUTANTS,
           *backward.MUTANTS, *decode.MUTANTS, *ring.MUTANTS]
