"""``python -m gqa_flash.course.grader``: grade submissions (see ``gqa_flash.course.grader.grade``)."""

import sys

from gqa_flash.course.grader.grade import main

sys.exit(main())
