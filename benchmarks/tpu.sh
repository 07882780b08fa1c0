#!/usr/bin/env bash
# One TPU host (benchmarks/gpu.sh for TPU chips), under 10 minutes: the attention backends' numerics on this device
# (tests/attention_test.py: cudnn / pallas against xla), sampler tokens/s and HBM roofline
# fraction (static batches and the streaming sampler at 64 and 256 slots), trainer MFU,
# weight-sync time (benchmarks/accelerator.py, attention_impl auto, falling back to xla),
# each printed beside benchmarks/roofline.py's prediction for this chip
# (benchmarks/measured_vs_predicted.py), then a short asynchronous GSM8K-format run of a
# random-init model of RhoMath-1B's shape. Everything goes to ${OUT:-/tmp/tba_tpu}.
#
#   bash benchmarks/tpu.sh                    # a v5e chip by default
#   CHIP=v5p HBM_GBPS=2765 PEAK_TFLOPS=459 bash benchmarks/tpu.sh
#
# The steps are gpu.sh's; only the chip's peaks, its name and the output folder differ.
set -euo pipefail
export CHIP="${CHIP:-v5e}" HBM_GBPS="${HBM_GBPS:-819}" PEAK_TFLOPS="${PEAK_TFLOPS:-197}"
export OUT="${OUT:-/tmp/tba_tpu}"
exec bash "$(dirname "$0")/gpu.sh"
