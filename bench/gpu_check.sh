#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py): PyTorch on CUDA vs ONNX Runtime on the CPU (and every other
# execution provider there), on the detectron2 fixtures and the bundled trained model, one table.
# Then the RTX-engine step (bench/gpu_check_rtx.py): where TensorRT for RTX's package is installed
# (extra tensorrt-rtx; this script installs nothing) it builds engines ahead of time, and runs them
# only on a GPU TensorRT for RTX runs on (compute capability 7.5/8.0/8.6/8.9/12.x); elsewhere
# (H100 / H200: 9.0) one line says why nothing ran, and without the package that nothing was built.
# Needs a CUDA build of PyTorch and this package's Python dependencies; about 3 minutes on an H100.
#   bench/gpu_check.sh                 # all models, CUDA
#   bench/gpu_check.sh --device cpu    # the same on the CPU (what CI's machine can run)
#   bench/gpu_check.sh --no-rtx        # without the RTX-engine step
#   python3 bench/gpu_check_rtx.py     # the RTX-engine step alone
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" bench/gpu_check.py "$@"
