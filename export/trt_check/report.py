"""What :func:`~norcal.export.trt_check.check_model` finds: one Finding per problem, in a Report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from norcal.core.profiles import Profile

if TYPE_CHECKING:
    from .nvidia_parser import ParserVerdict


@dataclass
class Finding:
    """One problem: ``severity`` is "error" (TensorRT would refuse it) or "warning"."""

    severity: str
    node: str  # node name, with the calling function nodes before it ("norcal > sub")
    op_type: str
    reason: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.node} ({self.op_type}): {self.reason}"


@dataclass
class Report:
    """The outcome of :func:`check_model`."""

    tensorrt_version: str
    opset: int | None
    num_nodes: int  # after expanding local functions, subgraphs included
    op_types: list[str]
    findings: list[Finding] = field(default_factory=list)
    profiles: dict[str, Profile] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    plugins: list[dict] = field(default_factory=list)  # tensorrt_targets.plugins_needed
    nvidia: ParserVerdict | None = None  # NVIDIA's own parser, where one is installed

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def compatible(self) -> bool:
        return not self.errors
