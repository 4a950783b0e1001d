"""Write the zip you hand in: ``python -m gqa_flash.course.grader.handin [--out PATH]`` (``make submission``).

The zip holds your graded files from ``gqa_flash/``, flat, as the grader reads
them::

    submission.zip
        naive.py
        online_softmax.py
        tiled.py
        forward.py
        windows.py       bonus, only once you have started it
        backward.py      bonus, only once you have started it
        decode.py        bonus, only once you have started it
        ring.py          bonus, only once you have started it

A file that is still the stub you were given is left out, and named: the
grader grades a missing file as its stub, so leaving it out costs nothing. The
grader's own test decides what "still the stub" means
(:func:`gqa_flash.course.grader.started.not_started`): comments do not start a file, one
line of code does.

A file with a syntax error goes in all the same, with a loud warning and its
line: the grader then scores 0 for that module only, and an hour before the
deadline a zip with one broken module beats no zip at all. Nothing here
imports or runs your code; it is only compiled.
"""

from __future__ import annotations

import argparse
import ast
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from gqa_flash.course import layout
from gqa_flash.course.grader.started import not_started, stub_fingerprints

DEFAULT_NAME = "submission.zip"
HOW_TO_HAND_IN = ("Hand it in: upload {zip} to your course's platform (Gradescope, Canvas, Moodle...), "
                  "as your instructor says.")


@dataclass
class Handin:
    """What goes into the zip, and what stays out and why."""

    files: dict[str, bytes] = field(default_factory=dict)  # graded file name -> its bytes, in course order
    not_started: list[str] = field(default_factory=list)  # still the stub: left out
    missing: list[str] = field(default_factory=list)  # no such file in gqa_flash/: nothing to put in
    broken: dict[str, str] = field(default_factory=dict)  # in the zip, but does not compile: name -> the error


def collect(package_dir: Path = layout.PACKAGE_DIR, prints: dict[str, str] | None = None) -> Handin:
    """Sort the graded files of ``package_dir`` into those to hand in and those to leave out.

    ``prints``: the stubs' fingerprints (default: the course's own, from its completed files or the edition's
    manifest)."""
    prints = stub_fingerprints(package_dir.parent) if prints is None else prints
    handin = Handin()
    for name in layout.GRADED_FILES:
        path = package_dir / name
        if not path.is_file():
            handin.missing.append(name)
            continue
        content = path.read_bytes()
        if not_started(name, content, prints):
            handin.not_started.append(name)
            continue
        handin.files[name] = content
        error = compile_error(name, content)
        if error is not None:
            handin.broken[name] = error
    return handin


def compile_error(name: str, content: bytes) -> str | None:
    """'line 12: SyntaxError: expected ':'' if the file does not compile, else None. Nothing is run."""
    try:
        ast.parse(content, filename=name)
    except SyntaxError as e:
        where = f"line {e.lineno}: " if e.lineno is not None else ""
        return f"{where}SyntaxError: {e.msg}"
    except ValueError as e:  # a NUL byte, a bad encoding
        return f"not readable as Python source ({e})"
    return None


def write_zip(files: dict[str, bytes], out: Path) -> None:
    """The files, flat, in a zip at ``out``: whole or not at all (an interrupted write leaves the old one)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    stamp = time.localtime()[:6]
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in files.items():
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, content)
    tmp.replace(out)


def _kind(name: str) -> str:
    return "bonus" if Path(name).stem in layout.BONUS_MODULES else "required"


def _listing(names, why=lambda name: "") -> list[str]:
    return [f"  {name:<20} {_kind(name):<9} {why(name)}".rstrip() for name in names]


def main(argv: list[str] | None = None, package_dir: Path = layout.PACKAGE_DIR) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gqa_flash.course.grader.handin",
        description="Write the zip you hand in: your graded files from gqa_flash/, flat (make submission).")
    parser.add_argument("--out", type=Path, default=package_dir.parent / DEFAULT_NAME,
                        help=f"where to write it: a .zip file or a folder (default: {DEFAULT_NAME} "
                             "at the course's root)")
    args = parser.parse_args(argv)
    out = args.out / DEFAULT_NAME if args.out.is_dir() else args.out
    if out.suffix.lower() != ".zip":
        print(f"submission: --out {args.out}: give a path ending in .zip (the grader reads a zip)", file=sys.stderr)
        return 2

    handin = collect(package_dir)
    source = package_dir.name + "/"
    if not handin.files:
        why = [f"{label}: {', '.join(names)}" for label, names in
               (("still the stub you were given", handin.not_started), ("missing", handin.missing)) if names]
        print(f"submission: nothing to hand in: no graded file in {source} is started yet ({'; '.join(why)}). "
              "No zip written.\n"
              "Write your code in those files (the notebooks show where), then run make submission again.",
              file=sys.stderr)
        return 1

    write_zip(handin.files, out)
    lines = [f"In the zip, from {source}:", *_listing(handin.files)]
    if handin.not_started or handin.missing:
        lines += ["Left out (the grader grades a missing file as its stub: 0 points for a required one):",
                  *_listing(handin.not_started, lambda name: "not started: still the stub"),
                  *_listing(handin.missing, lambda name: f"missing: no {source}{name}")]
    shown = out.resolve()
    try:
        shown = shown.relative_to(Path.cwd())
    except ValueError:
        pass
    lines += ["", f"Wrote {shown} ({len(handin.files)} file{'s' * (len(handin.files) != 1)}).",
              HOW_TO_HAND_IN.format(zip=out.name),
              f"To see what the grader makes of it first: make grade ARGS={shown}"]
    for name, error in handin.broken.items():  # last, where they are read
        lines += ["", f"WARNING: {source}{name} does not compile ({error}).",
                  f"  It is in the zip, but none of its tests can import it: the grader will score 0 for {name}.",
                  "  Fix it, then run make submission again."]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
