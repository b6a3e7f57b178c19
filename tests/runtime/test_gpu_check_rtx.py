"""bench/gpu_check_rtx.py, the GPU check's RTX-engine step, where no GPU is: its real builds with
NVIDIA's TensorRT for RTX, and what it says and counts on each kind of GPU (a stand-in reports
the GPU; nothing is run, and nothing may be reported as run)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "bench"))
import gpu_check_rtx  # noqa: E402
from test_tensorrt_rtx import _StandInTorch  # noqa: E402


@pytest.fixture
def step(monkeypatch):
    """rtx_step on the tiny detector alone, on a GPU of the given capability and name."""
    from norcal.runtime.backends.tensorrt import runner

    monkeypatch.setattr(gpu_check_rtx, "_graphs", lambda folder, say: [gpu_check_rtx._tiny_detector(folder)])

    def run(capability, name):
        monkeypatch.setattr(gpu_check_rtx, "_gpu", lambda device: ("{}.{}".format(*capability), name))
        monkeypatch.setattr(runner, "_torch_cuda", lambda: _StandInTorch(capability, name))
        lines = []
        return gpu_check_rtx.rtx_step("cuda", say=lines.append), lines

    return run


def test_on_an_h100_it_builds_says_why_it_did_not_run_and_the_runner_refuses(step):
    failed, lines = step((9, 0), "NVIDIA H100 80GB HBM3")
    assert failed == 0 and len(lines) == 3, lines
    assert lines[0].startswith("RTX engine: tiny detector: built ahead of time in ")
    assert "for compute capability 8.0 8.6 8.9 12.0 12.1" in lines[0] and "TensorRT for RTX 1.7.1.116" in lines[0]
    assert lines[1] == ("RTX engine: tiny detector: not run: NVIDIA H100 80GB HBM3 is compute capability 9.0; "
                        "TensorRT for RTX engines run on SM 7.5/8.0/8.6/8.9/12.x only")
    assert lines[2].startswith("RTX engine: tiny detector: the runner refuses it: ")
    assert "is a TensorRT for RTX engine and cannot run on NVIDIA H100 80GB HBM3 (compute capability 9.0)" in lines[2]


def test_without_tensorrt_for_rtx_it_builds_nothing_and_says_so(step, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt_rtx_bindings", None)
    failed, lines = step((9, 0), "NVIDIA H200")
    assert failed == 0 and lines == [
        "RTX engine: built nothing: TensorRT for RTX's Python package is not installed (module "
        "tensorrt_rtx_bindings; pip install 'norcal-deploy[tensorrt-rtx]')",
        "RTX engine: not run: NVIDIA H200 is compute capability 9.0; TensorRT for RTX engines run on SM "
        "7.5/8.0/8.6/8.9/12.x only"]
    failed, lines = step((8, 9), "NVIDIA GeForce RTX 4090")
    assert failed == 0 and lines[1] == ("RTX engine: not run on NVIDIA GeForce RTX 4090 (compute capability 8.9, "
                                        "which TensorRT for RTX runs on): its runtime is that package, which is "
                                        "not installed here")


def test_on_an_rtx_gpu_it_builds_for_it_and_a_run_that_cannot_happen_is_a_failure(step):
    """A stand-in 8.9 GPU on a machine with none: the engine is built for 8.9 and handed to the
    runner, whose real TensorRT for RTX cannot load it here: counted as failed, never passed."""
    failed, lines = step((8, 9), "NVIDIA GeForce RTX 4090")
    assert "for compute capability 8.9 (" in lines[0], lines
    assert failed == 1 and lines[1].startswith("RTX engine: tiny detector: run FAILED: ")
    assert "TensorRT for RTX 1.7.1.116 cannot load it" in lines[1]
    assert not any("PASS" in line for line in lines)
