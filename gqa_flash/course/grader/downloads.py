"""A learning platform's bulk download, split into one submission per student.

Canvas and Blackboard deliver a whole class as ONE flat folder (or zip), each
file named after its student::

    garciajose_12345_678901_naive.py             Canvas
    smithann_LATE_23456_789012_naive.py          Canvas, handed in late
    garciajose_12345_678901_hw1.zip              Canvas, the student's own zip
    Assignment 1_jgarcia_attempt_2026-12-01-10-00-00_naive.py   Blackboard
    Assignment 1_jgarcia_attempt_2026-12-01-10-00-00.txt        Blackboard's receipt

(Moodle gives a folder per student, ``José García_12345_assignsubmission_file_/``:
each is a submission already; a zip of those folders is split the same way.)

Given such a download, the grader grades each student's files as a submission of
its own (a :class:`Piece`), named ``DOWNLOAD#STUDENT`` in the CSV's submission
column (``canvas.zip#garciajose``; its path column keeps the path given,
``submissions/canvas.zip#garciajose``), with the student's name, the platform's
id for them and whether Canvas marked it late in columns of their own
(:mod:`gqa_flash.course.grader.platforms`), and ``STUDENT.json`` in the results. Two
students of one name (two John Smiths: ``smithjohn``) are told apart by their
ids: ``smithjohn_12345``.
A download is split only when every graded file in it carries a platform's name
and they are two students' or more: one student's platform-named files stay one
submission. Nothing is run here; each student's files are copied, as they are
(a zip stays a zip), into a folder of their own, which ``submission.read`` then
reads like any other submission, with its notes.
"""

from __future__ import annotations

import shutil
import unicodedata
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gqa_flash.course.grader import submission
from gqa_flash.course.grader.platforms import RECEIPT, Student, one_student, student_of
from gqa_flash.course.grader.submission import MAX_INNER_ZIP_BYTES, graded_name

SHOWN = 6  # students named in the line that announces a download; the rest are counted


@dataclass(frozen=True)
class Piece:
    """One student's files of a bulk download: a submission of its own."""

    download: Path  # the folder or zip, as given to the grader
    student: Student  # as the platform names them: garciajose, Canvas's user id 12345
    folder: Path  # their files, copied out of the download (removed when the grading ends)
    # How the batch names them: the platform's name for them, with their id if another student of the download
    # has the same name (two John Smiths of Canvas: smithjohn_12345, smithjohn_23456).
    who: str = ""

    def __post_init__(self):
        if not self.who:
            object.__setattr__(self, "who", self.student.name)

    @property
    def platform(self) -> str:
        return self.student.platform

    @property
    def name(self) -> str:
        """The CSV's submission column: the download's own name and the student, canvas.zip#garciajose."""
        return f"{self.download.name}#{self.who}"

    def __str__(self) -> str:  # the CSV's path column (where the batch finds it again), and a name for --regrade
        return f"{self.download}#{self.who}"

    def names(self) -> set[str]:
        """What --regrade accepts for it: the CSV's name, the download's file name or stem with #student, or
        the student alone."""
        return {str(self), self.name, f"{self.download.stem}#{self.who}", self.who}


def split(source: Path, scratch: Path) -> tuple[list[Piece], str] | None:
    """A bulk download's pieces, one per student, their files copied under scratch, and the line that says
    so; None if source is not a download of two students or more (it is then graded as one submission)."""
    source = Path(source)
    if source.is_symlink() or not (source.is_dir() or source.suffix.lower() == ".zip" and source.is_file()):
        return None
    quiet = submission.Submission(str(source))  # its notes come again when each student's files are read
    candidates = submission._folder(source, quiet) if source.is_dir() else submission._zip(source, quiet)
    if candidates is None:  # a zip that cannot be read: graded as one submission, whose note says why
        return None
    owners = {top: student_of(top, folder) for top, folder in _entries(source).items()}  # None: no one's
    graded = [rel for rel, _, _ in candidates if graded_name(rel.name).graded]
    # Two students or more among the download's names (a student whose only file is a zip that cannot be read
    # counts: they get a row saying so), and every graded file someone's.
    if not graded or any(owners.get(rel.parts[0]) is None for rel in graded) \
            or len({found.key for found in owners.values() if found is not None}) < 2:
        return None
    tops: dict[tuple, set[str]] = {}  # a student (Student.key) -> their top-level entries (a corrupt zip too)
    students: dict[tuple, Student] = {}
    for top, found in owners.items():
        if found is not None:
            tops.setdefault(found.key, set()).add(top)
            students[found.key] = one_student(s for s in (students.get(found.key), found) if s)  # late if one is
    names = Counter(key[1] for key in tops)
    pieces, skipped = [], []
    for n, (key, entries) in enumerate(sorted(tops.items(), key=lambda kv: (kv[0][1].casefold(), kv[0][2]))):
        student = students[key]
        who = student.name if names[student.name] == 1 else f"{student.name}_{student.user_id}"
        folder = scratch / str(n) / _folder_name(who)
        folder.mkdir(parents=True)
        skipped += _copy(source, {e for e in entries if not RECEIPT.match(e)}, folder)
        pieces.append(Piece(source, student, folder, who))
    return pieces, _line(source, pieces, [top for top, found in owners.items() if found is None], skipped)


def _entries(source: Path) -> dict[str, bool]:
    """{name: is a folder} of a download's top-level files and folders (a zip's too), hidden ones left out."""
    if source.is_dir():
        found = {_nfc(p.name): p.is_dir() and not p.is_symlink() for p in source.iterdir()}
    else:
        found = {}
        with zipfile.ZipFile(source) as archive:
            for info in archive.infolist():
                rel = _member_path(info)
                if rel.parts and not rel.is_absolute():
                    found[rel.parts[0]] = found.get(rel.parts[0], False) or len(rel.parts) > 1 or info.is_dir()
    return {name: folder for name, folder in found.items() if not name.startswith(".")
            and name not in submission.SKIPPED_DIRS | submission.SKIPPED_FILES}


def _copy(source: Path, entries: set[str], folder: Path) -> list[str]:
    """Copy a student's top-level entries of the download into folder, as they are; returns those skipped."""
    if source.is_dir():
        paths = {_nfc(p.name): p for p in source.iterdir()}
        for entry in entries:
            path = paths[entry]
            if path.is_dir():
                shutil.copytree(path, folder / entry, symlinks=True)  # a link stays one: the reader names it
            else:
                shutil.copyfile(path, folder / entry)
        return []
    skipped = []
    with zipfile.ZipFile(source) as archive:
        for info in archive.infolist():
            rel = _member_path(info)
            if info.is_dir() or not rel.parts or rel.parts[0] not in entries:
                continue
            if rel.is_absolute() or ".." in rel.parts or info.file_size > MAX_INNER_ZIP_BYTES:
                skipped.append(str(rel))  # never written outside folder; too large to be a student's files
                continue
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(archive.read(info))
    return skipped


def _member_path(info: zipfile.ZipInfo) -> PurePosixPath:
    """A zip member's path as submission.read reads it: UTF-8 even when the zip did not say so, NFC."""
    name = info.filename
    if not info.flag_bits & 0x800:
        try:
            name = name.encode("cp437").decode("utf-8")
        except UnicodeError:
            pass
    return PurePosixPath(_nfc(name.replace("\\", "/")))


def _line(source: Path, pieces: list[Piece], unowned: list[str], skipped: list[str]) -> str:
    """'canvas.zip: a Canvas download: 2 students (garciajose, smithann), each graded as a submission of its own'."""
    platforms = " and ".join(p for p, _ in Counter(p.platform for p in pieces).most_common())
    names = ", ".join(p.who for p in pieces[:SHOWN]) + (f" and {len(pieces) - SHOWN} more" if len(pieces) > SHOWN
                                                         else "")
    line = (f"{source}: a {platforms} download: {len(pieces)} students ({names}), "
            "each graded as a submission of its own")
    if unowned:
        more = f" and {len(unowned) - SHOWN} more" if len(unowned) > SHOWN else ""
        line += f"; ignored {', '.join(sorted(unowned)[:SHOWN])}{more} (no student's name)"
    if skipped:
        line += f"; skipped {', '.join(skipped)} (a path outside the download, or too large)"
    return line


def _folder_name(who: str) -> str:
    """The student's folder: their name, where a file name can hold it (the reader's notes may show it)."""
    name = "".join("_" if c in "/\\" or unicodedata.category(c) == "Cc" else c for c in who).strip().lstrip(".")
    return name[:100] or "student"


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)
