"""The instructor's tools: the grader, the Gradescope bundle and the release of the student files.

``python -m gqa_flash.course.grader SUBMISSION ...`` grades (``grade``: it reads a
submission with ``submission``, builds a pristine copy of the course with
``sandbox``, runs the graded tests with ``testrun`` and the pytest
``plugin``, and writes Gradescope's results with ``gradescope``).
``python -m gqa_flash.course.grader.release`` writes the student files.
"""
