"""The names learning platforms give a student's files, and who they say handed them in.

A bulk download names each file (or folder) after its student::

    garciajose_12345_678901_naive.py                          Canvas: name, user id, submission id
    smithann_LATE_23456_789012_naive.py                       Canvas, handed in late
    José García_12345_assignsubmission_file_naive.py          Moodle: name, participant id
    José García_12345_assignsubmission_file_/naive.py         Moodle, "download submissions in folders"
    Assignment 1_jgarcia_attempt_2026-12-01-10-00-00_naive.py  Blackboard: the username
    Assignment 1_jgarcia_attempt_2026-12-01-10-00-00.txt      Blackboard's receipt of the attempt

:func:`student_of` reads a :class:`Student` from such a name: what a gradebook needs (the name, the
platform's id, whether it was late). :mod:`gqa_flash.course.grader.submission` reads the graded file a name stands
for, :mod:`gqa_flash.course.grader.downloads` splits a download by student, and the grader's CSV has a column each.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

# How learning platforms name the files of a bulk download; ``orig`` is the name the student gave the file.
# Most specific first: Canvas's pattern would take the others' names too.
# ``id``: Canvas's user id (its gradebook's ID column), Moodle's participant id (its grading worksheet's
# "Participant 12345"); Blackboard names a student by username only. Canvas writes _LATE_ into a late one's.
PLATFORM_NAMES = (
    ("Moodle", re.compile(r"^(?P<who>.+?)_(?P<id>\d+)_assignsubmission_[a-z]+_(?P<orig>.+)$")),
    ("Blackboard", re.compile(r"^.+_(?P<who>[^_]+)_attempt_\d{4}(?:-\d\d){5}_(?P<orig>.+)$")),
    ("Canvas", re.compile(r"^(?P<who>[^_]+)(?P<late>_LATE)?_(?P<id>\d+)_\d+_(?P<orig>.+)$")),
)
MOODLE_FOLDER = re.compile(r"^(?P<who>.+?)_(?P<id>\d+)_assignsubmission_[a-z]+_?$")  # Moodle's "download in folders"
# Blackboard's receipt of an attempt (the student's comments, the file list): the platform's, never graded.
RECEIPT = re.compile(r"^.+_(?P<who>[^_]+)_attempt_\d{4}(?:-\d\d){5}\.txt$")
CANVAS_AGAIN = re.compile(r"-(?P<n>\d+)(?=\.py$)")  # naive-1.py: Canvas's name for a re-submitted naive.py


@dataclass(frozen=True)
class Student:
    """Who handed a submission in, as a learning platform's names say."""

    name: str  # garciajose (Canvas), José García (Moodle), jgarcia (Blackboard)
    user_id: str = ""  # Canvas's user id, Moodle's participant id, Blackboard's username
    late: bool | None = None  # Canvas's _LATE_: True or False; None where the platform's names do not say
    platform: str = ""  # Canvas, Moodle or Blackboard

    @property
    def key(self) -> tuple[str, str, str]:
        """One student: two John Smiths of Canvas (both smithjohn) differ by their user ids."""
        return self.platform, self.name, self.user_id


def student_of(name: str, folder: bool = False) -> Student | None:
    """The student a platform's file or folder name names (garciajose_LATE_12345_678901_naive.py,
    José García_12345_assignsubmission_file_/ with folder=True), or None."""
    if folder and (m := MOODLE_FOLDER.match(name)):
        return Student(_nfc(m["who"]), m["id"], None, "Moodle")
    if m := RECEIPT.match(name):
        return Student(_nfc(m["who"]), _nfc(m["who"]), None, "Blackboard")
    for platform, pattern in PLATFORM_NAMES:
        if m := pattern.match(name):
            user_id = m.groupdict().get("id") or _nfc(m["who"])  # Blackboard: the username is the id
            late = bool(m["late"]) if platform == "Canvas" else None
            return Student(_nfc(m["who"]), user_id, late, platform)
    return None


def one_student(students) -> Student | None:
    """The one student these records name (late if any of them says so), or None if they name none or several."""
    found: dict[tuple, Student] = {}
    for s in students:
        was = found.get(s.key)
        late = s.late if was is None or was.late is None else was.late or bool(s.late)
        found[s.key] = Student(s.name, s.user_id, late, s.platform)
    return next(iter(found.values())) if len(found) == 1 else None


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)  # macOS writes José as J-o-s-e-combining accent
