"""Finding a detector's box classifier: the Softmax/Sigmoid the NorCal node replaces.

The classifier: the tensor ``logits`` names; else the one a checkpoint export recorded
(``norcal.classifier_logits``; a cascade records one per stage, and each gets a node); else,
for foreign ONNX, the one Softmax/Sigmoid that :meth:`ClassifierView.search` finds: fed by a
Gemm/MatMul with weights (attention's Q K^T is not), as wide as the calibration (classes, +1
with a background slot) on its class axis and on no other axis. None, or several, is an error
naming what was found (tensors and shapes); the caller then names the tensor as ``logits``.

The class axis: a Softmax's own axis; a Sigmoid's is the one axis of the calibration's width
(YOLO's [B, C, A]).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
import onnx_graphsurgeon as gs

from norcal.core import contract
from norcal.core.calibration.spec import Calibration
from norcal.core.errors import NorcalError
from norcal.export.graph.model_view import ModelView, has_norcal
from norcal.export.graph.onnx_helpers import tensor_dims

# ops a classifier's logits may pass through between the Gemm/MatMul and the activation
_PASS_THROUGH = {"Identity", "Cast", "Reshape", "Flatten", "Add", "Squeeze", "Unsqueeze"}
_CLASSIFIER_OPS = {"Gemm", "MatMul"}
# ops between a layer's weight initializer and the layer (transposed, cast or quantized weights)
_WEIGHT_PATH = {"Identity", "Cast", "Transpose", "DequantizeLinear", "Reshape"}
_ACTIVATIONS = ("Softmax", "Sigmoid")


@dataclass
class Candidate:
    """A classifier activation the NorCal node can replace."""

    node: str          # the activation node's name
    op_type: str       # Softmax or Sigmoid
    logits: str        # tensor the activation reads
    output: str        # tensor the activation writes
    width: int | None  # size of the class axis (C+1 with background), when known
    producer: str      # op type of the classifier layer feeding it ("?" when none was found)
    axis: int | None = None  # the class axis of the logits (non-negative); None: the last, rank unknown
    shape: tuple[str, ...] | None = None  # the logits' shape, dims as names or sizes, when known
    problem: str = ""  # why it cannot be the classifier ("": nothing against it)

    def shape_text(self) -> str:
        return "[?]" if self.shape is None else f"[{', '.join(self.shape)}]"

    def axis_text(self) -> str:
        """e.g. "class axis 1 of [batch, 80, anchors]"."""
        if self.axis is None:
            return "class axis last (shape unknown)"
        return f"class axis {self.axis} of {self.shape_text()}"

    def describe(self) -> str:
        w = "?" if self.width is None else str(self.width)
        why = f": {self.problem}" if self.problem else ""
        return (f"{self.op_type} node {self.node!r} on {self.logits!r} {self.shape_text()} "
                f"({w} classes on {self.axis_text()}, from {self.producer}){why}")


def _is_default(domain: str | None) -> bool:
    return domain in (None, "", "ai.onnx")


def _has_weights(node: gs.Node) -> bool:
    """Whether a Gemm/MatMul multiplies by a constant (a layer's weights), not by another
    activation (attention's Q K^T, a bilinear op)."""
    if len(node.inputs) < 2:
        return False
    t = node.inputs[1]
    for _ in range(4):
        if isinstance(t, gs.Constant):
            return True
        if not t.inputs:
            return False
        src = t.inputs[0]
        if src.op == "Constant":
            return True
        if src.op not in _WEIGHT_PATH or not src.inputs:
            return False
        t = src.inputs[0]
    return False


def _weight_width(node: gs.Node) -> int | None:
    """Output width of a Gemm/MatMul from its weight initializer."""
    if len(node.inputs) < 2 or not isinstance(node.inputs[1], gs.Constant):
        return None
    dims = list(node.inputs[1].shape)
    if len(dims) != 2:
        return None
    return dims[0] if (node.op == "Gemm" and node.attrs.get("transB", 0)) else dims[1]


def _classifier_producer(tensor: gs.Tensor, depth: int = 4) -> gs.Node | None:
    for _ in range(depth):
        if not tensor.inputs:
            return None
        node = tensor.inputs[0]
        if node.op in _CLASSIFIER_OPS:
            return node
        if node.op not in _PASS_THROUGH:
            return None
        data_inputs = [i for i in node.inputs if i.name and not isinstance(i, gs.Constant)]
        if not data_inputs:
            return None
        tensor = data_inputs[0]
    return None


def _want(settings: Calibration | None) -> int | None:
    """The class-axis size a calibration needs: its classes, +1 for a background slot."""
    if settings is None or not settings.num_classes:
        return None
    return _expected_width(settings.num_classes, settings.background or "last")


def _is_silu(node: gs.Node) -> bool:
    """A Sigmoid whose output multiplies its own input: SiLU / Swish, an activation inside the network."""
    if node.op != "Sigmoid" or not node.outputs:
        return False
    x = node.inputs[0]
    return any(c.op == "Mul" and x in c.inputs for c in node.outputs[0].outputs)


def _listing(cands: list[Candidate], limit: int = 4) -> str:
    more = f"; and {len(cands) - limit} more" if len(cands) > limit else ""
    return "; ".join(c.describe() for c in cands[:limit]) + more


class ClassifierView(ModelView):
    """A model under surgery, searched for its box classifier."""

    def candidate(self, node: gs.Node, want: int | None, search: bool,
                  axis_hint: int | None = None) -> Candidate:
        """The activation ``node`` as a candidate, its class axis found and anything against it in
        ``problem``. want: the class-axis size the calibration needs (None: unknown). A Softmax's
        class axis is its own axis; a Sigmoid's is ``axis_hint`` (what an export recorded), else
        the one axis of size ``want``. With ``search`` (a foreign graph, nothing named), it must
        also look like a box classifier: fed by a Gemm/MatMul with weights, ``want`` wide on its
        class axis and on no other axis."""
        logits = node.inputs[0]
        dims = tensor_dims(self.types.get(logits.name))
        rank = None if dims is None else len(dims)
        shape = None if dims is None else tuple("?" if d is None else str(d) for d in dims)
        producer = _classifier_producer(logits)
        problem, axis = "", None
        if node.op == "Softmax":
            a = node.attrs.get("axis", -1 if self.opset >= 13 else 1)
            axis = a if a >= 0 else (None if rank is None else a + rank)
        elif axis_hint is not None:  # counted from the end when negative (-1: the last)
            axis = axis_hint if axis_hint >= 0 else (None if rank is None else axis_hint + rank)
        elif rank is not None:
            fits = [i for i, d in enumerate(dims) if want is not None and d == want]
            axis = fits[0] if len(fits) == 1 else rank - 1
            if len(fits) > 1:
                problem = (f"axes {', '.join(map(str, fits))} all have size {want}: cannot tell which "
                           "holds the classes")
        last = axis is None or (rank is not None and axis == rank - 1)
        width = dims[axis] if dims is not None and axis is not None and axis < len(dims) else None
        width = width if isinstance(width, int) else None
        if width is None and last and producer is not None:
            width = _weight_width(producer)
        if search and not problem:
            problem = self._unlike_classifier(producer, dims, axis, width, want)
        return Candidate(node.name, node.op, logits.name, node.outputs[0].name, width,
                         producer.op if producer is not None else "?", axis, shape, problem)

    @staticmethod
    def _unlike_classifier(producer: gs.Node | None, dims, axis, width, want) -> str:
        if producer is None:
            return "not fed by a Gemm/MatMul"
        if not _has_weights(producer):
            return f"its {producer.op} multiplies two activations (attention), not weights"
        if want is not None and width != want:
            return f"{'an unknown size' if width is None else width} on its class axis, not {want}"
        if dims is not None and axis is not None and width is not None:
            same = [i for i, d in enumerate(dims) if i != axis and d == width]
            if same:
                return f"axis {same[0]} has the same size {width}: cannot tell which holds the classes"
        return ""

    def search(self, want: int | None) -> list[Candidate]:
        """Every Softmax / Sigmoid as a candidate, except a Sigmoid that is half of a SiLU (x * sigmoid(x))."""
        found = []
        for node in self.graph.nodes:
            if _is_default(node.domain) and node.op in _ACTIVATIONS and node.inputs and not _is_silu(node):
                found.append(self.candidate(node, want, search=True))
        return found

    def named(self, logits: str, origin: str, want: int | None, axis_hint: int | None = None) -> Candidate:
        """The activation reading tensor ``logits`` (named by ``origin``)."""
        acts = [n for n in self.graph.nodes if n.op in _ACTIVATIONS and _is_default(n.domain)
                and n.inputs and n.inputs[0].name == logits]
        if not acts:
            raise NorcalError(f"tensor {logits!r}{origin} feeds no Softmax or Sigmoid node")
        if len(acts) > 1:
            raise NorcalError(f"tensor {logits!r}{origin} feeds {len(acts)} activations; cannot choose")
        cand = self.candidate(acts[0], want, search=False, axis_hint=axis_hint)
        if not cand.problem and cand.width is None and want is not None and axis_hint is None:
            cand.problem = (f"the size of its class axis ({cand.axis_text()}) is unknown: cannot check "
                            f"it against the calibration's {want}")
        if cand.problem:
            raise NorcalError(f"tensor {logits!r}{origin} {cand.shape_text()}: {cand.problem}", param="logits")
        return cand

    def classifiers(self, settings: Calibration | None, logits: str | None,
                    axis_hint: int | None = None) -> list[Candidate]:
        """The activations to calibrate: each tensor ``logits`` names (comma-separated), else
        each one the export recorded (a cascade has one per stage), else the heuristic's one."""
        want = _want(settings)
        if logits is not None:
            return [self.named(name, "", want, axis_hint) for name in contract.split_names(logits)]
        recorded = contract.recorded_logits(self.meta)
        if recorded:  # a checkpoint export: the classes are on the last axis
            return [self.named(name, f" (the model's {contract.CLASSIFIER_LOGITS})", want, -1)
                    for name in recorded]
        return [self.classifier(want, settings.num_classes if settings is not None else None)]

    def classifier(self, want: int | None, num_classes: int | None = None) -> Candidate:
        """The one box classifier the heuristic finds (foreign graphs); none, or several, is an
        error naming what was found."""
        found = self.search(want)
        fitting = [c for c in found if not c.problem]
        if len(fitting) == 1:
            return fitting[0]
        if fitting:
            raise NorcalError(f"ambiguous: {len(fitting)} classifier candidates: "
                              f"{_listing(fitting)}; name the one to calibrate as logits", param="logits")
        # what came close: fed by a Gemm/MatMul, or with an axis of the table's size
        near = [c for c in found if c.producer != "?" or (want is not None and str(want) in (c.shape or ()))]
        if near and all(c.problem.endswith(f"on its class axis, not {want}") for c in near):
            raise NorcalError(f"the table has {num_classes} classes, so the classifier should have "
                              f"{want} outputs, but the candidates are: {_listing(near)}")
        wide = "" if want is None else f", {want} wide on its class axis"
        seen = f"; found {_listing(near)}" if near else "; nothing comes close"
        raise NorcalError(f"found no box classifier (a Softmax or Sigmoid fed by a Gemm/MatMul with "
                          f"weights{wide}){seen}; name the classifier's input tensor as logits",
                          param="logits")


def classifier_candidates(model: onnx.ModelProto) -> list[Candidate]:
    """The classifier a checkpoint export recorded, or else the heuristic's candidates; on a
    calibrated model, those of the plain model under its NorCal node (the node replaced the
    activation they are found by)."""
    view = ClassifierView(model)
    if has_norcal(model):
        view.strip()
    if contract.recorded_logits(view.meta):
        return view.classifiers(None, None)
    return [c for c in view.search(None) if not c.problem]


def _expected_width(num_classes: int, background: str) -> int:
    return num_classes + (0 if background == "none" else 1)



_INT64_MAX = 2**63 - 1


def _constant(tensor: gs.Tensor):
    """A tensor's constant value (an initializer, or a Constant node's output), else None."""
    if isinstance(tensor, gs.Constant):
        return tensor.values
    if tensor.inputs and tensor.inputs[0].op == "Constant":
        value = tensor.inputs[0].attrs.get("value")
        return getattr(value, "values", None)
    return None


def _slice_on(node: gs.Node, rank: int | None) -> dict[int, tuple] | None:
    """A Slice's (start, end, step) per axis (non-negative where the rank is known; a bound that
    is not a constant: None); None when its axes are not known."""
    values = [_constant(t) for t in node.inputs[1:5]]
    starts, ends = values[0], values[1] if len(values) > 1 else None
    n = next((v.size for v in (starts, ends) if v is not None), None)
    if len(values) > 2 and values[2] is not None:
        axes = [int(v) for v in values[2].reshape(-1)]
    elif len(values) <= 2 and n is not None:
        axes = list(range(n))
    else:
        return None
    if rank is not None:
        axes = [a + rank if a < 0 else a for a in axes]

    def at(v, i, default=None):
        return default if v is None else int(v.reshape(-1)[i])

    steps = values[3] if len(values) > 3 else None
    return {a: (at(starts, i), at(ends, i), at(steps, i, 1 if len(values) <= 3 else None))
            for i, a in enumerate(axes)}


def background_in_graph(view: ModelView, cand: Candidate) -> tuple[str, str] | None:
    """Where the graph itself puts a softmax classifier's background: the consumer of its
    probabilities that drops one class column (torchvision's ``scores[:, 1:]``: "first";
    detectron2's ``scores[:, :-1]``: "last"), with that Slice node's name; None where no
    consumer says (the slot is then the caller's word).

    Followed through Identity / Cast and Slices on other axes (a per-image split), nothing else."""
    rank = None if cand.shape is None else len(cand.shape)
    axis = cand.axis if cand.axis is not None else (None if rank is None else rank - 1)
    out = next((t for n in view.graph.nodes if n.name == cand.node for t in n.outputs
                if t.name == cand.output), None)
    frontier, seen = [out] if out is not None else [], 0
    while frontier and seen < 16:
        tensor = frontier.pop()
        for node in tensor.outputs:
            seen += 1
            if node.op in ("Identity", "Cast"):
                frontier.extend(node.outputs)
                continue
            if node.op != "Slice":
                continue
            spans = _slice_on(node, rank)
            if spans is None:
                continue
            key = axis if axis is not None else -1
            if key not in spans:
                frontier.extend(node.outputs)  # a slice along rows or images: the classes are whole
                continue
            start, end, step = spans[key]
            wide = cand.width
            if step != 1 or start is None or end is None:
                continue
            if start == 1 and (end >= _INT64_MAX // 2 or (wide is not None and end >= wide)):
                return "first", node.name
            if start == 0 and (end == -1 or (wide is not None and end == wide - 1)):
                return "last", node.name
    return None
