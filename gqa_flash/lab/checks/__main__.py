"""``python -m gqa_flash.lab.checks``: the progress table, one line per check (see progress())."""

from gqa_flash.lab.checks import progress

progress()
