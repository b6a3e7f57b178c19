"""NVIDIA's own ONNX parser on a model, where one is installed, beside our table's verdict.

TensorRT for RTX (``tensorrt_rtx_bindings``) installs from the package index and parses on a
machine without a GPU; its parser is TensorRT's. The parser stops at its first refused node,
so the verdict is that node (if any) plus, for every op type of the model, whether the parser
has an importer for it. A refusal is explained by a listed RTX-only gap
(:data:`norcal.core.tensorrt_targets.RTX_GAPS`, and any op outside the ONNX domains, which
imports as a plugin: RTX_CUSTOM_OP) or else it is a disagreement with our table:
one of the two is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from norcal.core.errors import NorcalError
from norcal.core.tensorrt_targets import LIBRARIES, RTX_CUSTOM_OP, RTX_GAPS

ONNX_DOMAINS = ("", "ai.onnx")


@dataclass
class Refusal:
    """A node NVIDIA's parser refused, and whether a listed RTX-only gap explains it."""

    node: str
    op_type: str
    reason: str  # the parser's own words
    rtx_gap: bool


@dataclass
class ParserVerdict:
    """What NVIDIA's parser said of a model."""

    library: str  # e.g. "TensorRT for RTX 1.7.1.116"
    parsed: bool
    refusals: list[Refusal] = field(default_factory=list)
    no_importer: list[str] = field(default_factory=list)  # op types the parser has no importer for

    def unexplained(self) -> list[Refusal]:
        """Refusals no listed RTX-only gap explains."""
        return [r for r in self.refusals if not r.rtx_gap]

    def summary(self) -> str:
        """One line: the parser's verdict, its first refusal and what explains it."""
        if self.parsed:
            return f"{self.library} parser: parsed the whole graph"
        if not self.refusals:
            return f"{self.library} parser: refused the model without naming a node"
        r = self.refusals[0]
        why = (f"an RTX-only gap: {RTX_GAPS.get(r.op_type, RTX_CUSTOM_OP).reason}; TensorRT 10/11 build it"
               if r.rtx_gap
               else "no RTX-only gap explains it, so it is an error")
        return (f"{self.library} parser: stops at {r.node} ({r.op_type}; the parser stops at its first "
                f"refused node): {r.reason.rstrip()} ({why})")


def installed_parser(target: str = "rtx"):
    """The library's module, or None where it is not installed."""
    try:
        return LIBRARIES[target].load()
    except NorcalError:
        return None


def _silent_logger(trt):
    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, severity, msg):
            pass  # the parser's errors come back through get_error

    return Logger()


def parse_model(model: onnx.ModelProto, trt, title: str = "TensorRT for RTX") -> ParserVerdict:
    """Run NVIDIA's ONNX parser (plugins registered first, as norcal build does) on the model.

    External weights must be inside the model (check_model loads them)."""
    log = _silent_logger(trt)
    trt.init_libnvinfer_plugins(log, "")
    builder = trt.Builder(log)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, log)
    parsed = bool(parser.parse(model.SerializeToString()))
    domains = {n.name: n.domain for n in model.graph.node}
    refusals = []
    for i in range(parser.num_errors):
        e = parser.get_error(i)
        op, name = e.node_operator() or "-", e.node_name()
        custom = domains.get(name, "") not in ONNX_DOMAINS  # looked up as a plugin RTX lacks
        refusals.append(Refusal(name or ("model" if e.node() < 0 else f"#{e.node()}"), op,
                                e.desc(), op in RTX_GAPS or custom))
    ops = sorted({n.op_type for n in model.graph.node if n.domain in ONNX_DOMAINS})
    no_importer = [op for op in ops if not parser.supports_operator(op)]
    return ParserVerdict(f"{title} {trt.__version__}", parsed, refusals, no_importer)
