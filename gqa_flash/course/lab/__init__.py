"""What the notebooks use: their checks, their pictures, the benchmark and the tiny model.

Support code for the lessons, never graded and never edited by students:
``checks`` (the verdict of each exercise), ``viz`` and ``perf_plots`` (the
pictures), ``results`` (the committed H200 measurements, by topic, through
``notebooks/data/INDEX.csv``), ``bench`` (timings on a GPU:
``python -m gqa_flash.course.lab.bench``; ``bench_decode`` for decoding), ``tiny_model`` (notebook 06's
transformer) and ``generate`` (notebook 07's greedy decoding with a KV cache), ``kernel_viz``,
``window_viz``, ``decode_viz`` and ``ring_viz`` (notebooks 04, 04b, 07 and 08's pictures), and ``ring_run``
(ranks of gloo processes for notebook 08's checks).
"""
