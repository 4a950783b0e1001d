"""Reading a submission: a folder, a zip, one .py file, or the student's own working copy.

Only the graded files are taken (``naive.py``, ``online_softmax.py``, ...),
found by name at any depth, and only as bytes: nothing is extracted, nothing
is imported or run here. A zip inside the submission (a zip in a zip, a
Moodle folder holding the student's zip) is read the same way. Whatever else
a submission holds is ignored, and every surprise becomes a note the student
will read in the results:

* a name a learning platform gave the file in its bulk download (Canvas
  ``garciajose_12345_678901_naive.py``, ``..._naive-1.py`` for a re-submission;
  Moodle ``José García_12345_assignsubmission_file_naive.py``; Blackboard
  ``Assignment 1_jgarcia_attempt_2026-12-01-10-00-00_naive.py``), or a name
  that ends with a graded one after ``_``, ``-`` or a space (``l_single_naive.py``):
  graded as that file, with a note naming both;
* two files for one graded file: the exact name wins over such a name, then
  the shallowest, then Canvas's latest re-submission; the note says which
  was graded and which ignored;
* a whole course folder (a ``gqa_flash/`` package in it): its graded files are
  taken from the package, and the rest is one line, not a note per file;
* any other file: ignored, and named, with the graded name it probably meant
  (``Naive.py``, ``forward (1).py``, ``naive.py.txt``: did you mean ``naive.py``?);
  a notebook is never graded, and says so;
* nothing to grade at all (an empty zip, a notebook only, other files only):
  ``Submission.stop`` says so in one line, with what to hand in, and the
  grader grades nothing;
* a zip member with an absolute path or ``..`` in it (a "zip slip"), a
  symbolic link, a file too large to be code: skipped; macOS's ``__MACOSX``,
  hidden files and caches: skipped silently;
* a syntax error: found by compiling (never running) the file, so the
  student reads the line number even though the tests only see it fail to
  import;
* an import that graded code does not need (``ctypes``, ``subprocess``, the
  course's test helpers) or a call to ``exec``, ``open``, ``setattr``...: a
  line for the instructor to review;
* a name that reaches the course's answers or its guards (``fast_attention_forward``,
  ``gqa_flash.reference``, ``gqa_flash.course.lab``, ``sys._getframe``...): an integrity
  flag for the instructor, in the grader's ``integrity`` column. It costs no
  points by itself; a call that runs one during a graded test does
  (``gqa_flash.course.integrity``).
"""

from __future__ import annotations

import ast
import difflib
import functools
import io
import os
import re
import stat
import unicodedata
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from gqa_flash.course import layout
from gqa_flash.course.grader import started
from gqa_flash.course.grader.platforms import (CANVAS_AGAIN, MOODLE_FOLDER, PLATFORM_NAMES, Student, one_student,
                                        student_of)
from gqa_flash.course.layout import GRADED_FILES, GRADED_MODULES

MAX_FILE_BYTES = 1 << 20  # a graded module is a few kilobytes of code
MAX_INNER_ZIP_BYTES = 64 << 20  # a zip inside the submission is read in memory: this much at most
MAX_ZIP_DEPTH = 3  # a zip in a zip in a zip; deeper ones are named and skipped
SKIPPED_DIRS = {"__MACOSX", "__pycache__", ".ipynb_checkpoints", ".git"}
SKIPPED_FILES = {"Thumbs.db", "desktop.ini"}  # what Windows leaves behind; hidden files (.DS_Store) too
# What graded code imports; anything else is worth a look.
USUAL_IMPORTS = {"torch", "triton", "math", "numpy", "typing", "__future__", "functools", "dataclasses"}
UNUSUAL_CALLS = {"__import__", "exec", "eval", "compile", "open", "setattr", "globals", "vars"}
# gqa_flash.course.decode_launch (decode.py's given host side) and gqa_flash.course.launch under it: no answer
# there; they launch the kernels they are given; gqa_flash.course.context_parallel: ring.py's given layouts,
# transfers and block attention; gqa_flash.course.impl: how windows.py reaches the student's own forward.py
USUAL_COURSE_IMPORTS = ({"gqa_flash", "gqa_flash.course", "gqa_flash.course.runtime", "gqa_flash.course.launch",
                         "gqa_flash.course.decode_launch", "gqa_flash.course.context_parallel",
                         "gqa_flash.course.impl"}
                        | {f"gqa_flash.{m}" for m in layout.GRADED_MODULES})
PACKAGES = ("gqa_flash", "gqa_flash.course")  # `from P import name` imports P.name
# Names through which graded code could reach the course's answers, or its guards: worth an integrity flag.
ANSWER_NAMES = {"fast", "fast_attention_forward", "fast_attention_backward", "reference", "reference_attention",
                "reference_decode", "reference_gradients", "reference_softmax", "lab", "checks", "solutions",
                "integrity", "address_check", "testing", "tile_counts", "kernel_only", "_getframe", "settrace",
                "setprofile", "scaled_dot_product_attention", "flex_attention", "DisableTorchFunction",
                "DisableTorchFunctionSubclass", "_DisableTorchDispatch", "_disable_current_modes"}

# A graded name at the end of a longer one, after a separator: l_single_naive.py, fast_forward.py.
ENDS_WITH_GRADED = re.compile(rf"^(?P<before>.+)[_\- ](?P<module>{'|'.join(GRADED_MODULES)})\.py$")
# The course's notebooks whose names do not say their graded file.
NOTEBOOK_FILES = {"triton_kernel": "forward.py", "decoding": "decode.py"}
# The course's own files beside the graded ones in its package: with a graded file, they mark a copy of it.
COURSE_FILES = frozenset(p.name for p in layout.PACKAGE_DIR.iterdir() if p.is_file()) - set(GRADED_FILES)
MAX_NAMED = 12  # files named in one "ignored" line; the rest are counted
BONUS_FILES = frozenset(f"{m}.py" for m in layout.BONUS_MODULES)
# The routine note of a submission without (some of) the bonus files: the batch's summary counts it.
BONUS_NOT_HANDED_IN = "bonus not handed in: "
BONUS_NOT_STARTED = "(bonus not started)"  # a whole course folder's bonus files, still the stubs


@dataclass
class Submission:
    name: str  # the path it was read from
    files: dict[str, bytes] = field(default_factory=dict)  # graded file name -> content
    notes: list[str] = field(default_factory=list)  # for the student and the instructor
    flags: list[str] = field(default_factory=list)  # integrity: names that reach the course's answers
    # Nothing to grade (an empty zip, a notebook only, no graded file): one line saying so and what to hand
    # in, also the last of the notes. The grader then runs no test. None when there is something to grade.
    stop: str | None = None
    # The student, when a platform's names say who (the submission's own name, else its graded files' names,
    # if they name one student); None otherwise.
    student: Student | None = None


@dataclass(frozen=True)
class Name:
    """What a file's name says: the graded file it stands for, and why."""

    graded: str | None  # "naive.py", or None: not a graded file
    rank: int = 0  # 0: the graded name itself, 1: a platform's name for it, 2: a name that ends with it
    why: str = ""  # for the note: "a Canvas download name"
    orig: str = ""  # the name the student gave the file, without a platform's additions
    who: str | None = None  # the student, from a platform's name
    again: int = 0  # Canvas's re-submission number: 2 for naive-2.py
    student: Student | None = None  # who, with the platform's id and lateness


def graded_name(name: str) -> Name:
    """The graded file a file name stands for: naive.py for naive.py itself, for a learning platform's
    name of it (Canvas, Moodle, Blackboard) and for a name ending with it (l_single_naive.py)."""
    if name in GRADED_FILES:
        return Name(name, 0, "", name)
    platform, who, orig, again = None, None, name, 0
    for label, pattern in PLATFORM_NAMES:
        if m := pattern.match(name):
            platform, who, orig = label, unicodedata.normalize("NFC", m["who"]), m["orig"]
            break
    student = student_of(name) if platform else None
    why = f"a {platform} download name" if platform else ""
    if platform == "Canvas" and (m := CANVAS_AGAIN.search(orig)):
        again, orig = int(m["n"]), orig[:m.start()] + orig[m.end():]
        why += f", -{again} marking a re-submission"
    if platform and orig in GRADED_FILES:
        return Name(orig, 1, why, orig, who, again, student)
    m = ENDS_WITH_GRADED.match(orig)
    if m and not orig.startswith("test_"):  # test_naive.py is a test, never the graded file
        graded = f"{m['module']}.py"
        why = f"{why}, ending with {graded}" if why else f"its name ends with {graded}"
        return Name(graded, 2, why, orig, who, again, student)
    return Name(None, 0, why, orig, who, again, student)


def nearest(name: str) -> str | None:
    """The graded file a name probably meant (Naive.py, forward (1).py, naive.py.txt, my_tiled_test.py,
    01_naive_attention.ipynb), or None."""
    stem = re.sub(r"(\.[A-Za-z]{1,5})+$", "", name)  # naive.py.txt: naive
    words = re.sub(r"[^a-z0-9]+", "_", stem.lower()).strip("_")
    # A graded module's name at the start of a word; the last one if several (an_old_naive_now_tiled).
    at = {f: m.start() for f, mod in zip(GRADED_FILES, GRADED_MODULES) if (m := re.search(rf"(?:^|_){mod}", words))}
    at |= {f: words.index(alias) for alias, f in NOTEBOOK_FILES.items() if alias in words and f not in at}
    if at:
        return max(at, key=at.get)
    near = difflib.get_close_matches(f"{words}.py", GRADED_FILES, n=1, cutoff=0.75)
    return near[0] if near else None


def read(source: Path | None, expected=GRADED_FILES) -> Submission:
    """The graded files of a submission, with notes; never raises for a bad submission.

    ``expected``: the graded files being graded (all, or those of ``--only``),
    the ones whose absence is worth a note.
    """
    readable = True
    if source is None:
        sub = Submission("working copy")
        candidates = [c for c in _folder(layout.PACKAGE_DIR, sub, top_only=True) if c[0].name in GRADED_FILES]
    else:
        source = Path(source)
        sub = Submission(str(source))
        if source.is_symlink():
            sub.notes.append(f"{source} is a symbolic link; submit the files themselves")
            candidates, readable = [], False
        elif source.is_dir():
            candidates = _folder(source, sub)
        elif source.is_file() and source.suffix.lower() == ".zip":
            candidates = _zip(source, sub)
            readable, candidates = candidates is not None, candidates or []
        elif source.is_file() and source.suffix.lower() in (".py", ".ipynb"):  # a notebook alone: say so
            candidates = [(PurePosixPath(_nfc(source.name)), source.read_bytes, source.stat().st_size)]
        elif source.exists():
            sub.notes.append(f"{source} is not a folder, a .zip or a .py file")
            candidates, readable = [], False
        else:
            sub.notes.append(f"{source} does not exist")
            candidates, readable = [], False
    ignored = _choose(candidates, sub, expected)
    own = student_of(source.name or source.resolve().name, folder=source.is_dir()) if source is not None else None
    sub.student = own or sub.student  # a Moodle folder, a Canvas file handed in alone: the name says who
    for name, content in sub.files.items():
        sub.notes.extend(_check_code(name, content))
        sub.flags.extend(_answer_names(name, content))
    missing = [n for n in expected if n not in sub.files]
    if source is not None and not sub.files:
        # A folder whose only content is a zip that cannot be read is not "empty": its own note says why.
        readable = readable and not (not candidates and any("not a readable zip" in note for note in sub.notes))
        sub.stop = _nothing_to_grade(source, candidates if readable else None, ignored, expected)
        sub.notes.append(sub.stop)
    elif not sub.files:
        sub.notes.append(f"no graded file found (expected {', '.join(expected)}): every part is graded as its stub")
    else:
        required = [n for n in missing if n not in BONUS_FILES]
        bonus = [n for n in missing if n in BONUS_FILES]
        if required:
            sub.notes.append(f"missing {', '.join(required)}: graded as the unmodified stub")
        if bonus:  # routine: a batch counts it once in its summary, not on each submission's line
            sub.notes.append(f"{BONUS_NOT_HANDED_IN}{', '.join(bonus)} (graded as the stub{'s' * (len(bonus) > 1)}: "
                             "no bonus points)")
    return sub


def _nothing_to_grade(source: Path, candidates: list | None, ignored: list[PurePosixPath], expected) -> str:
    """The one line of a submission with nothing to grade: what it holds, and what to hand in instead.
    It names the notebooks and misnamed files itself (they have no line of their own then).

    ``candidates`` None: the submission could not be read (its own note says why)."""
    notebooks = [rel for rel in ignored if rel.suffix.lower() == ".ipynb"]
    misnamed = {rel: near for rel in ignored if rel not in notebooks and (near := _meant(rel))}
    names = "; ".join(f"{rel} is not named {near}" for rel, near in misnamed.items())
    if notebooks:
        wanted = [f for f in dict.fromkeys(map(_meant, notebooks + list(misnamed))) if f] or list(expected)
        what = "is a notebook" if len(notebooks) == 1 else "are notebooks"
        names = f"; {names}" if names else ""
        return f"{', '.join(map(str, notebooks))} {what}: notebooks are not graded{names}; {_hand_in(wanted)}"
    found = f"no graded file found (expected {', '.join(expected)})"
    if candidates is None:
        return f"nothing to grade: {found}; {_hand_in(expected)}"
    if not candidates:
        return f"{source.name} is empty: {found}; {_hand_in(expected)}"
    found = f"nothing to grade: {found} among its {len(candidates)} file{'s' * (len(candidates) != 1)}"
    if misnamed:
        return f"{found}; {names}; {_hand_in(list(dict.fromkeys(misnamed.values())))}"
    return f"{found}; {_hand_in(expected)}"


def _meant(rel: PurePosixPath) -> str | None:
    """The graded file an ignored file was probably meant to be, if it looks like code or is a notebook."""
    orig = graded_name(rel.name).orig
    like_code = ".py" in orig.lower() or "." not in orig or rel.suffix.lower() == ".ipynb"
    return nearest(orig) if like_code else None


def _hand_in(files) -> str:
    """What to hand in: the required files named, and the bonus ones only if started (the README says so)."""
    files = sorted(files, key=lambda f: GRADED_FILES.index(f) if f in GRADED_FILES else len(GRADED_FILES))
    required = [f for f in files if f not in BONUS_FILES] or files
    bonus = [f for f in files if f not in required]
    return (f"hand in {', '.join(f'gqa_flash/{f}' for f in required)} (your graded file{'s' * (len(required) != 1)})"
            + (f", and each bonus file you started ({', '.join(bonus)})" if bonus else "")
            + ", e.g. with make submission")


def _nfc(name: str) -> str:
    return unicodedata.normalize("NFC", name)  # macOS writes José as J-o-s-e-combining accent


def _folder(root: Path, sub: Submission, top_only: bool = False):
    """(relative path, reader, size) of every regular file under root, and of every file in a zip there;
    links and hidden folders skipped."""
    found = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = [] if top_only else sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("."))
        for name in sorted(files):
            path = Path(folder) / name
            rel = PurePosixPath(_nfc(path.relative_to(root).as_posix()))
            if name.startswith(".") or name in SKIPPED_FILES:
                continue
            if path.is_symlink() or not path.is_file():
                if name in GRADED_FILES:
                    sub.notes.append(f"skipped {rel}: a symbolic link, not a file")
                continue
            if not top_only and name.lower().endswith(".zip"):
                found.extend(_zip(path, sub, prefix=rel) or [])
                continue
            found.append((rel, path.read_bytes, path.stat().st_size))
    return found


def _zip(path: Path, sub: Submission, prefix: PurePosixPath = PurePosixPath()):
    """The files of a zip (see _members); None, with a note, if it cannot be read."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        sub.notes.append(f"{prefix if prefix.parts else path.name} is not a readable zip file ({e})")
        return None
    return _members(archive, sub, prefix, depth=1)


def _members(archive: zipfile.ZipFile, sub: Submission, prefix: PurePosixPath, depth: int):
    """(path, reader, size) of a zip's files, a zip inside it read the same way; paths under ``prefix``."""
    found = []
    for info in archive.infolist():
        if info.is_dir():
            continue
        filename = info.filename
        if not info.flag_bits & 0x800:  # not marked UTF-8: zipfile read it as cp437; many zippers wrote UTF-8
            try:
                filename = filename.encode("cp437").decode("utf-8")
            except UnicodeError:
                pass
        rel = PurePosixPath(_nfc(filename.replace("\\", "/")))
        shown = f"{prefix}/{filename}" if prefix.parts else filename
        # Zip slip: a member that would land outside the folder it is extracted to.
        # Nothing is ever extracted here, but such a member is never graded either.
        if rel.is_absolute() or ".." in rel.parts or (rel.parts and rel.parts[0].endswith(":")):
            sub.notes.append(f"skipped zip member {shown!r}: its path leaves the zip's folder")
            continue
        if not rel.parts or rel.name in SKIPPED_FILES or any(p in SKIPPED_DIRS or p.startswith(".") for p in rel.parts):
            continue
        if stat.S_ISLNK(info.external_attr >> 16):
            sub.notes.append(f"skipped zip member {shown!r}: a symbolic link, not a file")
            continue
        rel = prefix / rel
        if rel.suffix.lower() == ".zip":
            found.extend(_inner_zip(archive, info, rel, sub, depth))
            continue
        found.append((rel, lambda archive=archive, info=info: archive.read(info), info.file_size))
    return found


def _inner_zip(archive: zipfile.ZipFile, info: zipfile.ZipInfo, rel: PurePosixPath, sub: Submission, depth: int):
    """The files of a zip inside a zip, read in memory (within limits: a zip bomb is skipped, with a note)."""
    if depth >= MAX_ZIP_DEPTH:
        sub.notes.append(f"skipped {rel}: a zip {depth} zips deep; hand in one zip")
        return []
    if info.file_size > MAX_INNER_ZIP_BYTES:
        sub.notes.append(f"skipped {rel}: {info.file_size} bytes is too large for a zip of graded files")
        return []
    try:
        inner = zipfile.ZipFile(io.BytesIO(archive.read(info)))
    except Exception as e:  # a corrupt or encrypted zip, in any of the ways zipfile reports one
        sub.notes.append(f"{rel} is not a readable zip file ({e})")
        return []
    return _members(inner, sub, rel, depth + 1)


def _package(candidates) -> PurePosixPath | None:
    """The folder of a copy of the course's package among the files (a zip of a whole course folder):
    one that holds a graded file and is named gqa_flash, or holds two of the course's own files too."""
    paths = {c[0] for c in candidates}
    folders = {p.parent for p in paths if p.name in GRADED_FILES}
    packages = [f for f in folders
                if f.name == layout.PACKAGE_DIR.name or sum(f / n in paths for n in COURSE_FILES) >= 2]
    return min(packages, key=lambda f: (len(f.parts), str(f))) if packages else None


def _choose(candidates, sub: Submission, expected=GRADED_FILES) -> list[PurePosixPath]:
    """Pick each graded file of ``expected``, and say what was left aside and why; returns the files not taken for
    one. A graded file outside ``expected`` (a run of some modules only) is neither taken nor named."""
    first_note = len(sub.notes)
    package, course_files = _package(candidates), 0
    if package is not None:  # a whole course folder: only the package's graded files, and its student's own
        own = [c for c in candidates if c[0].parent == package and c[0].name not in COURSE_FILES]
        course_files, candidates = len(candidates) - len(own), own
    claims: dict[str, list[tuple]] = {}
    ignored: list[tuple] = []
    for candidate in candidates:
        name = graded_name(candidate[0].name)
        (claims.setdefault(name.graded, []) if name.graded else ignored).append((candidate, name))
    taken: dict[str, PurePosixPath] = {}
    for graded in (g for g in GRADED_FILES if g in expected):
        ranked = sorted(claims.get(graded, []),
                        key=lambda cn: (cn[1].rank, len(cn[0][0].parts), -cn[1].again, str(cn[0][0])))
        if not ranked:
            continue
        (rel, read, size), name = ranked[0]
        if len(ranked) > 1:
            sub.notes.append(_rivals(graded, ranked))
        if name.rank:
            sub.notes.append(f"graded {rel} as {graded} ({name.why})")
        if size > MAX_FILE_BYTES:
            sub.notes.append(f"skipped {rel}: {size} bytes is too large for a graded module")
            continue
        try:
            content = read()
        except Exception as e:  # a corrupt or encrypted zip member
            sub.notes.append(f"skipped {rel}: it cannot be read ({type(e).__name__}: {e})")
            continue
        if len(content) > MAX_FILE_BYTES:
            sub.notes.append(f"skipped {rel}: too large for a graded module")
            continue
        sub.files[graded], taken[graded] = content, rel
    if package is not None and course_files:
        sub.notes.insert(first_note, _course_folder(package, course_files, list(taken), _still_stubs(sub.files)))
    _name_the_ignored(ignored, taken, sub)
    named = [n.student for _, n in ignored + [cn for claim in claims.values() for cn in claim] if n.student]
    named += [student_of(p, folder=True) for c in candidates for p in c[0].parts[:-1] if MOODLE_FOLDER.match(p)]
    students = {s.key: s for s in named}
    if len(students) > 1:
        names = sorted(s.name if sum(o.name == s.name for o in students.values()) == 1 else f"{s.name} ({s.user_id})"
                       for s in students.values())
        sub.notes.append(f"these files are {len(students)} students' ({', '.join(names)}): "
                         "grade each student's files as a submission of its own")
    sub.student = one_student(named)
    return [c[0] for c, _ in ignored]


def _course_folder(package: PurePosixPath, course_files: int, taken: list[str], stubs: list[str]) -> str:
    """The one line of a whole course folder: what was graded from its package, and which of its graded files
    are still the stubs the course hands out (a bonus one is then not graded: the student never started it)."""
    where = f"its package {package}/" if package.parts else "the package at its top"
    own = [f for f in taken if f not in stubs]
    note = (f"a whole course folder: graded {', '.join(own) or 'no file'} from {where}, ignored its other "
            f"{course_files} files")
    required = [f for f in stubs if f not in BONUS_FILES]
    bonus = [f for f in stubs if f in BONUS_FILES]
    if required:
        are = "is still the stub" if len(required) == 1 else "are still the stubs"
        note += f"; {', '.join(required)} {are} handed out: not started"
    if bonus:
        stubs = "the stubs" if len(bonus) > 1 else "the stub"
        note += f"; not graded: {', '.join(bonus)}, still {stubs} handed out {BONUS_NOT_STARTED}"
    return note


@functools.cache
def _stub_prints() -> dict[str, str]:
    return started.stub_fingerprints()


def _still_stubs(files: dict[str, bytes]) -> list[str]:
    """The graded files whose code is still the stub the course hands out (comments aside)."""
    return [name for name, content in files.items() if started.not_started(name, content, _stub_prints())]


def _rivals(graded: str, ranked: list[tuple]) -> str:
    """'found 2 files for naive.py: graded naive.py (its exact name), ignored hw_naive.py'."""
    (win, _, _), best = ranked[0]
    others = ", ".join(str(c[0]) for c, _ in ranked[1:])
    if all(n.rank == 0 for _, n in ranked):
        return f"found {len(ranked)} copies of {graded}: graded {win}, ignored {others}"
    (second, _, _), next_best = ranked[1]
    if best.rank < next_best.rank:
        why = "its exact name" if best.rank == 0 else "a platform's name for it"
    elif len(win.parts) < len(second.parts):
        why = "the shallowest"
    elif best.again > next_best.again:
        why = "the latest re-submission"
    else:
        why = "the first by name"
    return f"found {len(ranked)} files for {graded}: graded {win} ({why}), ignored {others}"


def _name_the_ignored(ignored: list[tuple], taken: dict[str, PurePosixPath], sub: Submission) -> None:
    """A note for each file that looks meant to be graded (with its nearest graded name); one for the rest."""
    rest = []
    for (rel, _, _), _name in ignored:
        near = _meant(rel)
        found = f"; {near} is graded from {taken[near]}" if near in taken else ""
        if near and not taken:
            continue  # nothing else to grade: the line that stops the grader names this file
        if rel.suffix.lower() == ".ipynb":
            instead = found or (f"; hand in gqa_flash/{near}" if near else "")
            sub.notes.append(f"ignored {rel}: notebooks are not graded{instead}")
        elif near and found:
            sub.notes.append(f"ignored {rel}: not a graded file name{found}")
        elif near:
            sub.notes.append(f"ignored {rel}: not a graded file name (did you mean {near}?)")
        else:
            rest.append(str(rel))
    if rest:
        named = ", ".join(rest[:MAX_NAMED]) + (f" and {len(rest) - MAX_NAMED} more" if len(rest) > MAX_NAMED else "")
        sub.notes.append(f"ignored {named}: only {', '.join(GRADED_FILES)} are graded")


def _check_code(name: str, content: bytes) -> list[str]:
    """Syntax errors and unusual imports, found without running anything."""
    try:
        tree = ast.parse(content, filename=name)
    except SyntaxError as e:  # a NUL byte is one too, with no line on some Pythons
        where = f", line {e.lineno}" if e.lineno is not None else ""
        return [f"{name}{where}: SyntaxError: {e.msg}; none of its tests can pass"]
    except ValueError as e:  # null bytes, bad encoding
        return [f"{name} cannot be read as Python source ({e}); none of its tests can pass"]
    unusual, calls = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in UNUSUAL_CALLS:
            calls.add(node.func.id)
            continue
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module in PACKAGES]
        else:
            continue
        for module in modules:
            root = module.split(".")[0]
            if root == "gqa_flash":
                if module not in USUAL_COURSE_IMPORTS:
                    unusual.add(module)
            elif root not in USUAL_IMPORTS:
                unusual.add(module)
    notes = []
    if unusual:
        notes.append(f"review: {name} imports {', '.join(sorted(unusual))} "
                     "(graded code needs only torch, triton and math)")
    if calls:
        notes.append(f"review: {name} calls {', '.join(sorted(calls))}")
    return notes


def _answer_names(name: str, content: bytes) -> list[str]:
    """'review: forward.py names gqa_flash.fast_attention_forward (line 12)': names that reach the course's answers.

    Attributes, imports and strings only (a local variable called ``reference`` is no one's business)."""
    try:
        tree = ast.parse(content, filename=name)
    except (SyntaxError, ValueError):
        return []
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Attribute) and node.attr in ANSWER_NAMES:
            names = [node.attr]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] + ([node.module] if getattr(node, "module", None) else [])
            names = [m for m in modules if set(m.split(".")) & ANSWER_NAMES]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("gqa_flash."):
            names = [node.value] if set(node.value.split(".")) & ANSWER_NAMES else []
        for n in names:
            found.setdefault(n, getattr(node, "lineno", 0))
    return [f"review: {name} names {n} (line {line}), {_what_it_reaches(n)}"
            for n, line in sorted(found.items(), key=lambda kv: kv[1])]


PYTORCH_ATTENTION = {"scaled_dot_product_attention", "flex_attention"}
GUARDS = {"integrity", "address_check", "testing", "tile_counts", "kernel_only", "_getframe", "settrace",
          "setprofile", "DisableTorchFunction", "DisableTorchFunctionSubclass", "_DisableTorchDispatch",
          "_disable_current_modes"}


def _what_it_reaches(name: str) -> str:
    """What a flagged name leads to: PyTorch's attention, the grader's guards, or the course's answers."""
    parts = set(name.split("."))
    if parts & PYTORCH_ATTENTION:
        return "which is PyTorch's own attention, not the student's"
    if parts & GUARDS:
        return "which reaches the grader's own guards"
    return "which reaches the course's own answers or checks"
