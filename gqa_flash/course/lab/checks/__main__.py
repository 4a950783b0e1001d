"""``python -m gqa_flash.course.lab.checks``: the progress table, one line per check (see progress())."""

from gqa_flash.course.lab.checks import progress

progress()
