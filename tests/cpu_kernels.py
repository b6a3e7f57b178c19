"""What the CPU's int8 kernels are, for the bounds of tests that run int8 graphs in ONNX Runtime.

On x86 CPUs without VNNI (AVX2 only, e.g. this AMD EPYC), ONNX Runtime's u8s8 kernels multiply
with VPMADDUBSW, whose int16 sums of byte pairs saturate (ONNX Runtime's quantization guide says
so and suggests reduce_range): int8 graphs there agree less with fp32 than on a VNNI CPU. Each
bound that depends on it names both measurements."""

from __future__ import annotations

import platform
from pathlib import Path


def _x86_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((l for l in text.splitlines() if l.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def int8_saturates() -> bool:
    """True on an x86 CPU whose int8 dot products lack VNNI (AVX2's VPMADDUBSW path)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    flags = _x86_flags()
    return bool(flags) and not flags & {"avx512_vnni", "avx_vnni", "amx_int8"}


INT8_SATURATES = int8_saturates()
