#!/usr/bin/env bash
# The backward pass on a GPU: the gradients of Q, K and V given dO, for the graded backward (through
# gqa_flash.flash_attention, the implementation switch's backward.py) and the fast one
# (gqa_flash/fast/backward.py), against SDPA's default, FlashAttention-2 and cuDNN backends
# (python -m gqa_flash.course.lab.bench --backward; bf16, causal, GQA 32:8, head_dim 64 and 128, N = 1k, 4k, 16k;
# FLOPs counted as 2.5 times the forward's).
#
#   bash bench/backward_sweep.sh [--out DIR] [--budget SECONDS]
#
# Writes backward.csv, environment.txt and backward_sweep.log; committed runs of it are
# bench/record/h200_backward_main.csv (beside the forward sweep's h200_forward_beside_backward.csv)
# and h200_backward_without_ragged_loop.csv (one timing a provider, one after the other), and
# notebooks/data/h200_backward_main_interleaved.csv and ..._repeat.csv. Every provider is checked, then timed in
# interleaved rounds (--rounds, default 5); the CSV's tiles column says what the course kernels'
# autotuners picked.
#
# Time on the H200 (2026-12-04, with the rounds): 168 s, most of it the autotuners. Needs a CUDA GPU,
# torch and triton.

set -uo pipefail
PARTS="backward"
source "$(dirname "$0")/common.sh" "$@"

only backward && step backward 240 "$PYTHON" -m gqa_flash.course.lab.bench --backward --out "$OUT/backward.csv"
finish
