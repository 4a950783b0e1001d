"""``python -m gqa_flash.course.grader``: grade submissions (see ``gqa_flash.course.grader.cli``)."""

import sys

from gqa_flash.course.grader.cli import main

sys.exit(main())
