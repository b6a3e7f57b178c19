"""Graph surgery: find a detector's box classifier, put the NorCal node there, or take it out.

Pure functions ``ModelProto -> ModelProto`` (the input is never modified), written on
onnx-graphsurgeon: import, rewire, ``cleanup().toposort()``, export. The NorCal node replaces
the classifier's activation (Softmax over the last axis, or Sigmoid) and writes the
activation's output tensor, so everything downstream (score threshold, NMS, top-k) reads
calibrated scores. Running insertion on a model that already has NorCal replaces it.

The classifier: the tensor ``--logits`` names; else the one a checkpoint export recorded
(``norcal.classifier_logits``; a cascade records one per stage, and each gets a node); else,
for foreign ONNX, the one Softmax/Sigmoid fed by a Gemm/MatMul that :func:`find_classifiers`
finds.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from norcal.core import contract
from norcal.core.errors import NorcalError
from norcal.core.version import __version__
from norcal.export.norcal_node import NorCalSettings, make_function, make_nodes, make_prior

# ops a classifier's logits may pass through between the Gemm/MatMul and the activation
_PASS_THROUGH = {"Identity", "Cast", "Reshape", "Flatten", "Add", "Squeeze", "Unsqueeze"}
_CLASSIFIER_OPS = {"Gemm", "MatMul"}
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

    def describe(self) -> str:
        w = "?" if self.width is None else str(self.width)
        return f"{self.op_type} node {self.node!r} on {self.logits!r} ({w} classes, from {self.producer})"


def _opset(model: onnx.ModelProto) -> int:
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return op.version
    raise NorcalError("the model imports no default ONNX opset")


# Shape inference is the slow part of a surgery on a large detector; tuning and demos calibrate
# the same graph for many gammas, so its result is kept per graph structure (weights aside).
_SHAPES_CACHE: dict[bytes, dict[str, onnx.TypeProto]] = {}
_SHAPES_CACHE_SIZE = 4
_SMALL_INIT = 4096  # bytes: initializers shape inference may read as values (shapes, axes)


def _structure_key(model: onnx.ModelProto) -> bytes:
    h = hashlib.blake2b(digest_size=20)
    g = model.graph
    for part in (*model.opset_import, *model.functions, *g.node, *g.input, *g.output, *g.value_info):
        h.update(part.SerializeToString())
    for init in g.initializer:
        h.update(f"{init.name}|{init.data_type}|{list(init.dims)}".encode())
        if init.ByteSize() <= _SMALL_INIT:
            h.update(init.SerializeToString())
    return h.digest()


def _shapes(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    key = _structure_key(model)
    if key not in _SHAPES_CACHE:
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:  # shape inference is a help here, never a requirement
            inferred = model
        g = inferred.graph
        while len(_SHAPES_CACHE) >= _SHAPES_CACHE_SIZE:
            _SHAPES_CACHE.pop(next(iter(_SHAPES_CACHE)))
        _SHAPES_CACHE[key] = {v.name: v.type for v in [*g.value_info, *g.input, *g.output]}
    return _SHAPES_CACHE[key]


def _last_dim(tp: onnx.TypeProto | None) -> tuple[int | None, int | None]:
    """(rank, last dimension) of a tensor type, None where unknown."""
    if tp is None or not tp.tensor_type.HasField("shape"):
        return None, None
    dims = tp.tensor_type.shape.dim
    if not dims:
        return 0, None
    last = dims[-1]
    return len(dims), (last.dim_value if last.HasField("dim_value") else None)


def _is_default(domain: str | None) -> bool:
    return domain in (None, "", "ai.onnx")


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


class _View:
    """One model under surgery: its graphsurgeon graph, metadata and (once) inferred types."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.opset = _opset(model)
        self.graph = gs.import_onnx(model)
        # graphsurgeon keeps the model's own opset_import field here: copy it, the model stays as it is
        self.graph.import_domains = [onnx.helper.make_opsetid(o.domain, o.version) for o in model.opset_import]
        self.meta = {p.key: p.value for p in model.metadata_props}
        self.types = _shapes(model)

    def candidate(self, node: gs.Node, search: bool) -> Candidate | None:
        """The activation ``node`` as a candidate; with ``search``, only if it looks like a box
        classifier (Softmax over the last axis or Sigmoid, fed by a Gemm/MatMul)."""
        logits = node.inputs[0]
        rank, width = _last_dim(self.types.get(logits.name))
        if search and node.op == "Softmax":
            axis = node.attrs.get("axis", -1 if self.opset >= 13 else 1)
            if not (axis == -1 or (rank is not None and axis == rank - 1)):
                return None
        producer = _classifier_producer(logits)
        if producer is None and search:
            return None
        if producer is not None:
            width = width or _weight_width(producer)
        return Candidate(node.name, node.op, logits.name, node.outputs[0].name, width,
                         producer.op if producer is not None else "?")

    def search(self) -> list[Candidate]:
        found = []
        for node in self.graph.nodes:
            if _is_default(node.domain) and node.op in _ACTIVATIONS and node.inputs:
                c = self.candidate(node, search=True)
                if c is not None:
                    found.append(c)
        return found

    def named(self, logits: str, origin: str) -> Candidate:
        """The activation reading tensor ``logits`` (named by ``origin``)."""
        acts = [n for n in self.graph.nodes if n.op in _ACTIVATIONS and _is_default(n.domain)
                and n.inputs and n.inputs[0].name == logits]
        if not acts:
            raise NorcalError(f"tensor {logits!r}{origin} feeds no Softmax or Sigmoid node")
        if len(acts) > 1:
            raise NorcalError(f"tensor {logits!r}{origin} feeds {len(acts)} activations; cannot choose")
        return self.candidate(acts[0], search=False)

    def classifiers(self, settings: NorCalSettings | None, logits: str | None) -> list[Candidate]:
        """The activations to calibrate: each tensor ``logits`` names (comma-separated), else
        each one the export recorded (a cascade has one per stage), else the heuristic's one."""
        if logits is not None:
            return [self.named(name, "") for name in contract.split_names(logits)]
        recorded = contract.split_names(self.meta.get(contract.CLASSIFIER_LOGITS))
        if recorded:
            return [self.named(name, f" (the model's {contract.CLASSIFIER_LOGITS})") for name in recorded]
        return [self.classifier(settings)]

    def classifier(self, settings: NorCalSettings | None) -> Candidate:
        """The one box classifier the heuristic finds (foreign graphs)."""
        found = self.search()
        if not found:
            raise NorcalError("found no box classifier (a Softmax over the last axis or a Sigmoid fed by "
                              "a Gemm/MatMul); name the classifier's input tensor as logits",
                              param="logits")
        num_classes = settings.num_classes if settings is not None else 0
        want = _expected_width(num_classes, settings.background) if num_classes else None
        fitting = [c for c in found if want is None or c.width in (want, None)]
        if len(fitting) == 1:
            return fitting[0]
        listing = "; ".join(c.describe() for c in (fitting or found))
        if not fitting:
            raise NorcalError(f"the table has {num_classes} classes, so the classifier should have "
                              f"{want} outputs, but the candidates are: {listing}")
        raise NorcalError(f"ambiguous: {len(fitting)} classifier candidates: {listing}; "
                          "name the one to calibrate as logits", param="logits")

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
        for x, y, name in zip(logits, output, names):
            act = gs.Node("Sigmoid", name=name) if sigmoid else gs.Node("Softmax", name=name, attrs={"axis": -1})
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


def find_classifiers(model: onnx.ModelProto) -> list[Candidate]:
    """Softmax-over-last-axis and Sigmoid nodes fed by a Gemm/MatMul: the box classifiers of a
    foreign model (the heuristic; a checkpoint export names its classifier instead)."""
    return _View(model).search()


def classifier_candidates(model: onnx.ModelProto) -> list[Candidate]:
    """The classifier a checkpoint export recorded, or else the heuristic's candidates."""
    view = _View(model)
    if view.meta.get(contract.CLASSIFIER_LOGITS):
        return view.classifiers(None, None)
    return view.search()


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


def insert_norcal(model: onnx.ModelProto, log_prior: np.ndarray, settings: NorCalSettings,
                  logits: str | None = None, inline: bool = False) -> onnx.ModelProto:
    """Put a NorCal node on the box classifier (replacing any already there); a cascade's
    recorded stage classifiers get one node each, sharing the prior.

    log_prior: [K] from :func:`norcal.core.calibration.log_prior`, K = the classifier's width.
    logits: the classifier's logits tensor (comma-separated for several); when None, the ones
    NorCal already sits on, the ones a checkpoint export recorded, or the one the heuristic finds.
    """
    view = _View(model)
    if has_norcal(model):
        logits = logits or view.meta.get(contract.LOGITS)
        view.strip()
    cands = view.classifiers(settings, logits)
    lp = np.asarray(log_prior, dtype=np.float64).reshape(-1)
    recorded = _recorded_width(view.meta)
    for cand in cands:
        width = cand.width or recorded  # a dynamic shape: what the export recorded
        if width is not None and width != lp.size:
            raise NorcalError(f"the classifier {cand.node!r} has {width} logits per box but the "
                              f"calibration has {lp.size} ({settings.num_classes} classes from table, "
                              f"background {settings.background!r})", param=("table", "background"))
    if len({c.op_type for c in cands}) != 1:
        raise NorcalError("the classifiers to calibrate mix Softmax and Sigmoid activations")
    settings = dataclasses.replace(settings, activation=cands[0].op_type.lower())
    settings.validate()

    g = view.graph
    prior = make_prior(lp, view.elem_type(cands[0].logits))
    for k, cand in enumerate(cands):
        act = next(n for n in g.nodes if n.name == cand.node and n.outputs and n.outputs[0].name == cand.output)
        logits_t, output_t = act.inputs[0], act.outputs[0]
        act.inputs.clear()
        act.outputs.clear()  # cleanup() drops the replaced activation
        nodes = make_nodes(settings, logits_t, prior, output_t, inline)
        if k:
            _suffix(nodes, f"_{k}", keep={logits_t.name, prior.name, output_t.name})
        g.nodes.extend(nodes)
    if not inline:
        g.functions.append(make_function(settings, view.opset))
        if not any(o.domain == contract.NODE_DOMAIN for o in g.import_domains):
            g.import_domains.append(onnx.helper.make_opsetid(contract.NODE_DOMAIN, 1))
    view.meta.update(settings.metadata())
    join = contract.LIST_SEP.join
    view.meta.update({
        contract.LOGITS: join(c.logits for c in cands), contract.OUTPUT: join(c.output for c in cands),
        contract.NODE: join(c.node for c in cands), contract.INLINE: str(inline).lower(),
        contract.BACKGROUND_INDEX: str({"last": lp.size - 1, "first": 0}.get(settings.background, -1)),
        contract.TOOL_VERSION: __version__,
    })
    return view.export()


def _suffix(nodes: list[gs.Node], suffix: str, keep: set[str]) -> None:
    """Make a further copy's node names and internal tensor names unique in the graph."""
    for node in nodes:
        node.name = f"{node.name}{suffix}"
        for t in node.outputs:
            if t.name not in keep:
                t.name = f"{t.name}{suffix}"
