#!/usr/bin/env bash
# The kernels at fixed tiles on a GPU (BLOCK_M x BLOCK_N, warps, pipeline stages, query sub-tiles): what
# the autotuners' candidate lists are chosen from. bf16, causal, GQA 32:8, head_dim 64 and 128,
# N = 1k, 4k, 16k; each variant's error against SDPA is recorded with its time; ratios to SDPA's default
# in the same run.
#
#   bash bench/tile_sweep.sh [--out DIR] [--only PARTS] [--budget SECONDS]
#
# Parts, each with the file it writes [and the committed H200 file it made]:
#   graded         the graded forward kernel (the implementation switch's forward.py) at 11 tiles,
#                  bench/explore_forward.py -> graded_forward_tiles.csv [h200_graded_forward_tiles.csv]
#   fast_forward   the fast forward, autotuned and at fixed tiles, bench/explore_fast.py OUT fwd
#                  -> explore_fast_fwd.csv [h200_fast_forward_subtile_shapes.csv and the forward rows of
#                  h200_fast_tiles_forward_backward.csv, each with the tile list of its day]
#   fast_backward  the fast backward, autotuned and at fixed tiles, bench/explore_fast.py OUT bwd
#                  -> explore_fast_bwd.csv [the backward rows of h200_fast_tiles_forward_backward.csv]
# Also writes environment.txt and tile_sweep.log. The tile lists live in the two Python files: edit them
# to try other tiles.
#
# Time on the H200: graded 30 s (measured with this script on 2026-12-03). fast_forward and
# fast_backward were not timed with it: the committed fast-forward runs fitted in steps of 320 s and
# 260 s, and one run of both together in 330 s. So one 10-minute device call holds all three:
#   bash bench/tile_sweep.sh --budget 570
# Needs a CUDA GPU, torch and triton.

set -uo pipefail
PARTS="graded fast_forward fast_backward"
source "$(dirname "$0")/common.sh" "$@"

only graded && step graded 300 "$PYTHON" bench/explore_forward.py "$OUT"
only fast_forward && step fast_forward 400 "$PYTHON" bench/explore_fast.py "$OUT" fwd
only fast_backward && step fast_backward 300 "$PYTHON" bench/explore_fast.py "$OUT" bwd
finish
