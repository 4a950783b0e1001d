"""``python -m gqa_flash.grader``: grade submissions (see ``gqa_flash.grader.grade``)."""

import sys

from gqa_flash.grader.grade import main

sys.exit(main())
