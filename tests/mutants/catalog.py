"""Classic student bugs, each a small edit of a solution file: the graded tests must catch every one.

A mutant is a solution with one bug put in (a few edits of its text, each
``old`` found exactly once). Each graded module's mutants live in a file of
their own (``naive.py``, ``forward.py``...); this module defines what a mutant
is and gathers them all in ``MUTANTS``, in course order. ``tests/test_mutants.py`` grades each mutant on
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

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # the solution file it edits (solutions/<file>)
    edits: tuple[tuple[str, str], ...]  # (old, new), each old exactly once in the file
    bug: str  # the student's mistake, in words
    survives: str = ""  # why the graded tests miss it: a known hole
    loses: float = 0.0  # the fewest points of its module it must lose (points follow harm: README, "Grading")

    @property
    def module(self) -> str:
        return self.file.removesuffix(".py")

    def apply(self, text: str) -> str:
        for old, new in self.edits:
            count = text.count(old)
            if count != 1:
                raise ValueError(f"mutant {self.name}: {old!r} occurs {count} times in {self.file}, not once")
            text = text.replace(old, new)
        return text


def _m(name, file, bug, *edits, survives="", loses=0.0):
    return Mutant(name=name, file=file, edits=tuple(edits), bug=bug, survives=survives, loses=loses)



# The per-module lists import _m from here: gather them last.
from mutants import backward, decode, forward, naive, online_softmax, tiled  # noqa: E402

MUTANTS = [*naive.MUTANTS, *online_softmax.MUTANTS, *tiled.MUTANTS, *forward.MUTANTS, *backward.MUTANTS,
           *decode.MUTANTS]
