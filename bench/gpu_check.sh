#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py): PyTorch on CUDA vs ONNX Runtime on the CPU (and every other
# execution provider there), on the detectron2 fixtures and the bundled trained model, one table.
# Needs a CUDA build of PyTorch and this package's Python dependencies; about 3 minutes on an H100.
#   bench/gpu_check.sh                 # all models, CUDA
#   bench/gpu_check.sh --device cpu    # the same on the CPU (what CI's machine can run)
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" bench/gpu_check.py "$@"
