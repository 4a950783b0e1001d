"""The course's machinery: you need not open this folder to do the course.

It holds what stands beside your files: the public API's host side (``api``, ``launch``,
``decode_launch``, ``kv_cache``, ``context_parallel``), the implementation switch (``impl``), the
notebooks' checks and pictures (``lab/``), the inputs and verdicts the tests share (``testing``), the
guards that a graded call is your own work, and the grader (``grader/``). ``gqa_flash/README.md`` maps
each of its entries.
"""
