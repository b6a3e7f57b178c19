"""Graph surgery: find a detector's box classifier, put the NorCal node there, or take it out.

Pure functions ``ModelProto -> ModelProto`` (the input is never modified), written on
onnx-graphsurgeon: import, rewire, ``cleanup().toposort()``, export. The NorCal node replaces
the classifier's activation (Softmax over the last axis, or Sigmoid) and writes the
activation's output tensor, so everything downstream (score threshold, NMS, top-k) reads
calibrated scores. Running insertion on a model that already has NorCal replaces it.

The classifier: the tensor ``logits`` names; else the one a checkpoint export recorded
(``norcal.classifier_logits``; a cascade records one per stage, and each gets a node); else,
for foreign ONNX, the one Softmax/Sigmoid that :func:`find_classifiers` finds: fed by a
Gemm/MatMul with weights (attention's Q K^T is not), as wide as the calibration (classes, +1
with a background slot) on its class axis and on no other axis. None, or several, is an error
naming what was found (tensors and shapes); the caller then names the tensor as ``logits``.

The class axis: a Softmax's own axis; a Sigmoid's is the one axis of the calibration's width
(YOLO's [B, C, A]). The node broadcasts the prior along it and records it as
``norcal.class_axis`` when it is not the last; stripping and re-calibrating keep it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from norcal.core import contract
from norcal.core.calibration_spec import Calibration
from norcal.core.errors import NorcalError
from norcal.core.version import __version__
from norcal.export.graph.norcal_node import make_function, make_nodes, make_prior
from norcal.export.graph.onnx_helpers import default_opset, inferred_types, tensor_dims

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


class _View:
    """One model under surgery: its graphsurgeon graph, metadata and (once) inferred types."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.opset = default_opset(model)
        self.graph = gs.import_onnx(model)
        # graphsurgeon keeps the model's own opset_import field here: copy it, the model stays as it is
        self.graph.import_domains = [onnx.helper.make_opsetid(o.domain, o.version) for o in model.opset_import]
        self.meta = {p.key: p.value for p in model.metadata_props}
        self.types = inferred_types(model)

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
        recorded = contract.split_names(self.meta.get(contract.CLASSIFIER_LOGITS))
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

    def elem_type(self, tensor: str) -> int:
        tp = self.types.get(tensor)
        if tp is not None and tp.tensor_type.elem_type:
            return tp.tensor_type.elem_type
        return onnx.TensorProto.FLOAT

    def strip(self) -> None:
        """Take the NorCal node (or its inlined ops), prior and function out of the graph and
        put the plain activation back; the node keys leave the metadata."""
        logits = contract.split_names(self.meta.get(contract.LOGITS))
        output = contract.split_names(self.meta.get(contract.OUTPUT))
        if not logits or len(output) != len(logits):
            raise NorcalError(f"the model's NorCal node has no {contract.LOGITS}/{contract.OUTPUT} metadata")
        sigmoid = self.meta.get(contract.ACTIVATION) == "sigmoid"
        names = contract.split_names(self.meta.get(contract.NODE))
        names = names if len(names) == len(logits) else ["Sigmoid" if sigmoid else "Softmax"] * len(logits)
        g = self.graph
        for n in g.nodes:
            if _is_norcal_node(n.op, n.domain, n.name):
                n.inputs.clear()
                n.outputs.clear()
        tensors = g.tensors()
        axis = recorded_axis(self.meta)
        for x, y, name in zip(logits, output, names):
            act = (gs.Node("Sigmoid", name=name) if sigmoid
                   else gs.Node("Softmax", name=name, attrs={"axis": -1 if axis is None else axis}))
            act.inputs.append(tensors[x])
            act.outputs.append(tensors[y])
            g.nodes.append(act)
        g.functions = [f for f in g.functions
                       if not (f.domain == contract.NODE_DOMAIN and f.name == contract.NODE_OP_TYPE)]
        g.import_domains = [o for o in g.import_domains if o.domain != contract.NODE_DOMAIN]
        g.cleanup()  # drops the disconnected NorCal ops and the prior
        self.meta = {k: v for k, v in self.meta.items() if k not in contract.NODE_KEYS}

    def export(self) -> onnx.ModelProto:
        """The graph as a model; what graphsurgeon does not carry (metadata_props, the model's
        doc string, domain and version) is copied from the source model."""
        # mode="nodes": graphsurgeon 0.6.1's function sort recurses without end on any graph that
        # has both a subgraph (If/Loop) and a local function; our one function calls no other
        out = gs.export_onnx(self.graph.cleanup().toposort(mode="nodes"), do_type_check=False)
        out.doc_string, out.domain = self.model.doc_string, self.model.domain
        out.model_version = self.model.model_version
        onnx.helper.set_model_props(out, self.meta)
        return out


def find_classifiers(model: onnx.ModelProto, num_classes: int | None = None,
                     background: str = "last") -> list[Candidate]:
    """The Softmax / Sigmoid nodes that look like a foreign model's box classifier: fed by a
    Gemm/MatMul with weights (not attention's), and, given ``num_classes``, with one axis of the
    calibration's width (classes, +1 unless ``background`` is none) (the heuristic; a checkpoint
    export names its classifier instead)."""
    want = None if num_classes is None else _expected_width(num_classes, background)
    return [c for c in _View(model).search(want) if not c.problem]


def classifier_candidates(model: onnx.ModelProto) -> list[Candidate]:
    """The classifier a checkpoint export recorded, or else the heuristic's candidates; on a
    calibrated model, those of the plain model under its NorCal node (the node replaced the
    activation they are found by)."""
    view = _View(model)
    if has_norcal(model):
        view.strip()
    if view.meta.get(contract.CLASSIFIER_LOGITS):
        return view.classifiers(None, None)
    return [c for c in view.search(None) if not c.problem]


def recorded_axis(meta: dict[str, str]) -> int | None:
    """The class axis a NorCal node's metadata records (None: the last axis)."""
    raw = meta.get(contract.CLASS_AXIS)
    if raw is None:
        return None
    if not raw.isdigit():
        raise NorcalError(f"model metadata {contract.CLASS_AXIS}={raw!r} is not an axis index")
    return int(raw)


def placement(model: onnx.ModelProto) -> list[str]:
    """Where each NorCal node sits, for summaries: e.g. "'logits' (class axis 1 of [batch, 80, anchors])"."""
    meta = {p.key: p.value for p in model.metadata_props}
    types = inferred_types(model)
    axis = recorded_axis(meta)
    out = []
    for name in contract.split_names(meta.get(contract.LOGITS)):
        dims = tensor_dims(types.get(name))
        shape = "[?]" if dims is None else f"[{', '.join('?' if d is None else str(d) for d in dims)}]"
        a = (len(dims) - 1 if dims is not None else "last") if axis is None else axis
        out.append(f"{name} (class axis {a} of {shape})")
    return out


def _recorded_width(meta: dict[str, str]) -> int | None:
    """Logits per box of a checkpoint export's classifier, from its metadata (class count and
    background slot), for graphs whose shapes leave the class axis dynamic (RetinaNet)."""
    n = meta.get(contract.NUM_CLASSES)
    if not meta.get(contract.CLASSIFIER_LOGITS) or not (n or "").isdigit():
        return None
    return int(n) + (0 if meta.get(contract.CLASSIFIER_BACKGROUND) == "none" else 1)


def _expected_width(num_classes: int, background: str) -> int:
    return num_classes + (0 if background == "none" else 1)


def norcal_metadata(model: onnx.ModelProto) -> dict[str, str]:
    """The ``norcal.*`` metadata_props of a model: what the NorCal node baked in, and the
    runtime contract (resize sizes, category ids) of models exported from checkpoints."""
    return {p.key: p.value for p in model.metadata_props if p.key.startswith(contract.PREFIX)}


def has_norcal(model: onnx.ModelProto) -> bool:
    return any(_is_norcal_node(n.op_type, n.domain, n.name) for n in model.graph.node)


def _is_norcal_node(op_type: str, domain: str | None, name: str) -> bool:
    return ((domain == contract.NODE_DOMAIN and op_type == contract.NODE_OP_TYPE)
            or (name or "").startswith(contract.INLINE_PREFIX))


def strip_norcal(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove the NorCal node (or its inlined ops), restoring the plain activation. Only the
    node keys leave the metadata; runtime keys (sizes, classes, category ids) stay."""
    if not has_norcal(model):
        raise NorcalError("the model has no NorCal node to strip")
    view = _View(model)
    view.strip()
    return view.export()


def insert_norcal(model: onnx.ModelProto, calibration: Calibration) -> onnx.ModelProto:
    """Put a NorCal node on the box classifier (replacing any already there); a cascade's
    recorded stage classifiers get one node each, sharing the prior.

    calibration: resolved (:meth:`Calibration.resolve`, its table loaded), its prior [K], K =
    the classifier's class-axis size. calibration.logits: the classifier's logits tensor
    (comma-separated for several); when None, the ones NorCal already sits on, the ones a
    checkpoint export recorded, or the one the heuristic finds. calibration.inline: plain ops.
    """
    view = _View(model)
    logits, hint = calibration.logits, None
    if has_norcal(model):
        if not logits or logits == view.meta.get(contract.LOGITS):
            hint = recorded_axis(view.meta)  # re-calibrating: the axis the node was on (None: last)
            hint = -1 if hint is None else hint
        logits = logits or view.meta.get(contract.LOGITS)
        view.strip()
    cands = view.classifiers(calibration, logits, hint)
    lp = calibration.log_prior().reshape(-1)
    recorded = _recorded_width(view.meta)
    for cand in cands:
        width = cand.width or recorded  # a dynamic shape: what the export recorded
        if width is not None and width != lp.size:
            raise NorcalError(f"the classifier {cand.node!r} has {width} logits per box but the "
                              f"calibration has {lp.size} ({calibration.num_classes} classes from table, "
                              f"background {calibration.background!r})", param=("table", "background"))
    if len({c.op_type for c in cands}) != 1:
        raise NorcalError("the classifiers to calibrate mix Softmax and Sigmoid activations")
    axes = {_axis_from_end(view, c) for c in cands}
    if len(axes) != 1:
        raise NorcalError("the classifiers to calibrate have their classes on different axes")
    axis = axes.pop()
    calibration = calibration.with_activation(cands[0].op_type.lower())

    g = view.graph
    prior = make_prior(lp, view.elem_type(cands[0].logits))
    for k, cand in enumerate(cands):
        act = next(n for n in g.nodes if n.name == cand.node and n.outputs and n.outputs[0].name == cand.output)
        logits_t, output_t = act.inputs[0], act.outputs[0]
        act.inputs.clear()
        act.outputs.clear()  # cleanup() drops the replaced activation
        nodes = make_nodes(calibration, logits_t, prior, output_t, calibration.inline, axis)
        if k:
            _suffix(nodes, f"_{k}", keep={logits_t.name, prior.name, output_t.name})
        g.nodes.extend(nodes)
    if not calibration.inline:
        g.functions.append(make_function(calibration, view.opset, axis))
        if not any(o.domain == contract.NODE_DOMAIN for o in g.import_domains):
            g.import_domains.append(onnx.helper.make_opsetid(contract.NODE_DOMAIN, 1))
    view.meta.update(contract.calibration_metadata(calibration))
    join = contract.LIST_SEP.join
    view.meta.update({
        contract.LOGITS: join(c.logits for c in cands), contract.OUTPUT: join(c.output for c in cands),
        contract.NODE: join(c.node for c in cands), contract.INLINE: str(calibration.inline).lower(),
        contract.BACKGROUND_INDEX: str({"last": lp.size - 1, "first": 0}.get(calibration.background, -1)),
        contract.TOOL_VERSION: __version__,
    })
    if axis != -1:
        view.meta[contract.CLASS_AXIS] = str(cands[0].axis)
    return view.export()


def _axis_from_end(view: _View, cand: Candidate) -> int:
    """A candidate's class axis counted from the end (-1: the last), as the node's body takes it."""
    dims = tensor_dims(view.types.get(cand.logits))
    if cand.axis is None or dims is None:
        if cand.axis not in (None, -1):
            raise NorcalError(f"tensor {cand.logits!r} has an unknown rank: cannot place the prior on "
                              f"its axis {cand.axis}", param="logits")
        return -1
    return cand.axis - len(dims)


def _suffix(nodes: list[gs.Node], suffix: str, keep: set[str]) -> None:
    """Make a further copy's node names and internal tensor names unique in the graph."""
    for node in nodes:
        node.name = f"{node.name}{suffix}"
        for t in node.outputs:
            if t.name not in keep:
                t.name = f"{t.name}{suffix}"
