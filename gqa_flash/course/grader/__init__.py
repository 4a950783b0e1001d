"""The grader, the Gradescope bundle and the zip a student hands in.

``python -m gqa_flash.course.grader SUBMISSION ...`` grades (``cli``, the command line; ``grade``: it reads a
submission with ``submission``, builds a pristine copy of the course with ``sandbox``, runs the graded tests
with ``testrun`` and the pytest ``plugin``; ``report`` writes the table and the CSV, ``gradescope`` the
results.json). ``bundle`` writes Gradescope's autograder zip, ``started`` tells a module not started by its
stub's fingerprint, ``stubs`` writes the stubs, ``handin`` the student's zip. The maintainers' tools that write
the stubs into the package and the student edition are ``tools/release.py`` and ``tools/student_edition.py``.
"""
