#!/usr/bin/env bash
# The backward pass on a GPU: the gradients of Q, K and V given dO, for the graded backward (through
# gqa_flash.flash_attention, the implementation switch's backward.py) and the fast one
# (gqa_flash/fast/backward.py), against SDPA's default, FlashAttention-2 and cuDNN backends
# (python -m gqa_flash.lab.bench --backward; bf16, causal, GQA 32:8, head_dim 64 and 128, N = 1k, 4k, 16k;
# FLOPs counted as 2.5 times the forward's).
#
#   bash bench/backward_sweep.sh [--out DIR] [--budget SECONDS]
#
# Writes backward.csv, environment.txt and backward_sweep.log. The committed backward numbers
# (notebooks/data/h200_fast_tiles_forward_backward.csv) came from bench/tile_sweep.sh's explore_fast.py
# instead, which also times fixed tiles; this is the benchmark's own sweep, with every SDPA backend.
#
# Time on the H200, measured with this script on 2026-12-03: 2 min (126 s). That run is the only one of
# this sweep so far, and it is not committed. Needs a CUDA GPU, torch and triton.

set -uo pipefail
PARTS="backward"
source "$(dirname "$0")/common.sh" "$@"

only backward && step backward 240 "$PYTHON" -m gqa_flash.lab.bench --backward --out "$OUT/backward.csv"
finish
