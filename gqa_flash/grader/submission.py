"""Reading a submission: a folder, a zip, one .py file, or the student's own working copy.

Only the graded files are taken (``naive.py``, ``online_softmax.py``, ...),
found by name at any depth, and only as bytes: nothing is extracted, nothing
is imported or run here. Whatever else a submission holds is ignored, and
every surprise becomes a note the student will read in the results:

* a file with a near-miss name (``Naive.py``, ``forward (1).py``): ignored,
  with the name it probably meant;
* two copies of one graded file: the shallowest is graded;
* a zip member with an absolute path or ``..`` in it (a "zip slip"), a
  symbolic link, a file too large to be code: skipped;
* a syntax error: found by compiling (never running) the file, so the
  student reads the line number even though the tests only see it fail to
  import;
* an import that graded code does not need (``ctypes``, ``subprocess``, the
  course's test helpers) or a call to ``exec``, ``open``, ``setattr``...: a
  line for the instructor to review;
* a name that reaches the course's answers or its guards (``fast_attention_forward``,
  ``gqa_flash.reference``, ``gqa_flash.lab``, ``sys._getframe``...): an integrity
  flag for the instructor, in the grader's ``integrity`` column. It costs no
  points by itself; a call that runs one during a graded test does
  (``gqa_flash.integrity``).
"""

from __future__ import annotations

import ast
import difflib
import os
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from gqa_flash import layout
from gqa_flash.layout import GRADED_FILES

MAX_FILE_BYTES = 1 << 20  # a graded module is a few kilobytes of code
SKIPPED_DIRS = {"__MACOSX", "__pycache__", ".ipynb_checkpoints", ".git"}
# What graded code imports; anything else is worth a look.
USUAL_IMPORTS = {"torch", "triton", "math", "numpy", "typing", "__future__", "functools", "dataclasses"}
UNUSUAL_CALLS = {"__import__", "exec", "eval", "compile", "open", "setattr", "globals", "vars"}
USUAL_COURSE_IMPORTS = {"gqa_flash", "gqa_flash.runtime"} | {f"gqa_flash.{m}" for m in layout.GRADED_MODULES}
# Names through which graded code could reach the course's answers, or its guards: worth an integrity flag.
ANSWER_NAMES = {"fast", "fast_attention_forward", "fast_attention_backward", "reference", "reference_attention",
                "reference_decode", "reference_gradients", "reference_softmax", "lab", "checks", "solutions",
                "integrity", "address_check", "testing", "kernel_only", "_getframe", "settrace", "setprofile",
                "scaled_dot_product_attention", "flex_attention", "DisableTorchFunction",
                "DisableTorchFunctionSubclass", "_DisableTorchDispatch", "_disable_current_modes"}


@dataclass
class Submission:
    name: str  # as it appears in tables and CSV rows
    files: dict[str, bytes] = field(default_factory=dict)  # graded file name -> content
    notes: list[str] = field(default_factory=list)  # for the student and the instructor
    flags: list[str] = field(default_factory=list)  # integrity: names that reach the course's answers


def read(source: Path | None, expected=GRADED_FILES) -> Submission:
    """The graded files of a submission, with notes; never raises for a bad submission.

    ``expected``: the graded files being graded (all, or those of ``--only``),
    the ones whose absence is worth a note.
    """
    if source is None:
        sub = Submission("working copy")
        candidates = [c for c in _folder(layout.PACKAGE_DIR, sub, top_only=True) if c[0].name in GRADED_FILES]
    else:
        source = Path(source)
        sub = Submission(str(source))
        if source.is_symlink():
            sub.notes.append(f"{source} is a symbolic link; submit the files themselves")
            candidates = []
        elif source.is_dir():
            candidates = _folder(source, sub)
        elif source.is_file() and source.suffix.lower() == ".zip":
            candidates = _zip(source, sub)
        elif source.is_file() and source.suffix == ".py":
            candidates = [(PurePosixPath(source.name), source.read_bytes, source.stat().st_size)]
        elif source.exists():
            sub.notes.append(f"{source} is not a folder, a .zip or a .py file")
            candidates = []
        else:
            sub.notes.append(f"{source} does not exist")
            candidates = []
    _choose(candidates, sub)
    for name, content in sub.files.items():
        sub.notes.extend(_check_code(name, content))
        sub.flags.extend(_answer_names(name, content))
    missing = [n for n in expected if n not in sub.files]
    if not sub.files:
        sub.notes.append(f"no graded file found (expected {', '.join(expected)}): every part is graded as its stub")
    elif missing:
        sub.notes.append(f"missing {', '.join(missing)}: graded as the unmodified stub")
    return sub


def _folder(root: Path, sub: Submission, top_only: bool = False):
    """(relative path, reader, size) of every regular file under root; links and hidden folders skipped."""
    found = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = [] if top_only else sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("."))
        for name in sorted(files):
            path = Path(folder) / name
            rel = PurePosixPath(path.relative_to(root).as_posix())
            if name.startswith("."):
                continue
            if path.is_symlink() or not path.is_file():
                if name in GRADED_FILES:
                    sub.notes.append(f"skipped {rel}: a symbolic link, not a file")
                continue
            found.append((rel, path.read_bytes, path.stat().st_size))
    return found


def _zip(path: Path, sub: Submission):
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        sub.notes.append(f"{path.name} is not a readable zip file ({e})")
        return []
    found = []
    for info in archive.infolist():
        if info.is_dir():
            continue
        rel = PurePosixPath(info.filename.replace("\\", "/"))
        # Zip slip: a member that would land outside the folder it is extracted to.
        # Nothing is ever extracted here, but such a member is never graded either.
        if rel.is_absolute() or ".." in rel.parts or (rel.parts and rel.parts[0].endswith(":")):
            sub.notes.append(f"skipped zip member {info.filename!r}: its path leaves the zip's folder")
            continue
        if any(p in SKIPPED_DIRS or p.startswith(".") for p in rel.parts):
            continue
        if stat.S_ISLNK(info.external_attr >> 16):
            sub.notes.append(f"skipped zip member {info.filename!r}: a symbolic link, not a file")
            continue
        found.append((rel, lambda info=info: archive.read(info), info.file_size))
    return found


def _choose(candidates, sub: Submission) -> None:
    """Pick each graded file (the shallowest copy), and say what was left aside and why."""
    by_name: dict[str, list] = {}
    for rel, read, size in candidates:
        by_name.setdefault(rel.name, []).append((rel, read, size))
    for name in GRADED_FILES:
        copies = sorted(by_name.pop(name, []), key=lambda c: (len(c[0].parts), str(c[0])))
        if not copies:
            continue
        rel, read, size = copies[0]
        if len(copies) > 1:
            others = ", ".join(str(c[0]) for c in copies[1:])
            sub.notes.append(f"found {len(copies)} copies of {name}: graded {rel}, ignored {others}")
        if size > MAX_FILE_BYTES:
            sub.notes.append(f"skipped {rel}: {size} bytes is too large for a graded module")
            continue
        content = read()
        if len(content) > MAX_FILE_BYTES:
            sub.notes.append(f"skipped {rel}: too large for a graded module")
            continue
        sub.files[name] = content
    # A near miss is worth a note each; the rest (a whole course folder, say) one line in all.
    others = 0
    for name, copies in sorted(by_name.items()):
        near = difflib.get_close_matches(name.lower().replace(" ", "_"), GRADED_FILES, n=1, cutoff=0.75)
        if near and name.endswith(".py"):
            sub.notes.extend(f"ignored {c[0]}: not a graded file name (did you mean {near[0]}?)" for c in copies)
        else:
            others += len(copies)
    if others:
        sub.notes.append(f"ignored {others} other file{'s' * (others != 1)}: only {', '.join(GRADED_FILES)} are graded")


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
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "gqa_flash"]
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
    return [f"review: {name} names {n} (line {line}), which reaches the course's own answers or checks"
            for n, line in sorted(found.items(), key=lambda kv: kv[1])]
