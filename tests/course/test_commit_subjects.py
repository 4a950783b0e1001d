"""Commit subjects fit in 72 characters (docs/instructors.md, "Contributing"): `git log --oneline` and blame
views show the subject alone, and the course's median subject was 221 characters. Commits made before this
rule are left as they are; every later one is held to it. Skipped outside a git checkout (the student edition,
an archive) and in a clone too shallow to hold the first commit checked."""

import subprocess

import pytest

from gqa_flash.course import layout

SINCE = "6cda68c"  # the rule holds for the commits after this one
MAX_SUBJECT = 72


def _git(*args):
    return subprocess.run(["git", "-C", str(layout.COURSE_DIR), *args], capture_output=True, text=True, timeout=60)


def test_every_commit_subject_since_the_rule_fits_in_72_characters():
    if _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout")
    if _git("cat-file", "-e", f"{SINCE}^{{commit}}").returncode != 0:
        pytest.skip(f"this clone does not hold {SINCE} (shallow)")
    log = _git("log", "--format=%h %s", f"{SINCE}..HEAD")
    assert log.returncode == 0, log.stderr
    long = [line for line in log.stdout.splitlines() if len(line.split(" ", 1)[1]) > MAX_SUBJECT]
    assert not long, f"commit subjects over {MAX_SUBJECT} characters (put the rest in the body):\n" + "\n".join(long)
