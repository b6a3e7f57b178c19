"""Graph surgery: put the NorCal node on a detector's box classifier, or take it out.

Pure functions ``ModelProto -> ModelProto`` (the input is never modified), written on
onnx-graphsurgeon: import, rewire, ``cleanup().toposort()``, export. The NorCal node replaces
the classifier's activation (Softmax over the last axis, or Sigmoid) and writes the
activation's output tensor, so everything downstream (score threshold, NMS, top-k) reads
calibrated scores. Running insertion on a model that already has NorCal replaces it.

Which activation is the classifier, and its class axis: :mod:`norcal.export.graph.classifier_search`.
The node broadcasts the prior along the class axis and records it as ``norcal.class_axis`` when
it is not the last; stripping and re-calibrating keep it.
"""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs

from norcal.core import contract
from norcal.core.calibration.meta import calibration_metadata
from norcal.core.calibration.spec import Calibration
from norcal.core.errors import NorcalError
from norcal.core.version import __version__
from norcal.export.graph.classifier_search import Candidate, ClassifierView, background_in_graph
from norcal.export.graph.model_view import ModelView, has_norcal, recorded_axis
from norcal.export.graph.norcal_node import make_function, make_nodes, make_prior
from norcal.export.graph.onnx_helpers import inferred_types, tensor_dims

__all__ = ["has_norcal", "insert_norcal", "norcal_metadata", "placement", "strip_norcal"]


def norcal_metadata(model: onnx.ModelProto) -> dict[str, str]:
    """The ``norcal.*`` metadata_props of a model: what the NorCal node baked in, and the
    runtime contract (resize sizes, category ids) of models exported from checkpoints."""
    return {p.key: p.value for p in model.metadata_props if p.key.startswith(contract.PREFIX)}


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


def strip_norcal(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove the NorCal node (or its inlined ops), restoring the plain activation. Only the
    node keys leave the metadata; runtime keys (sizes, classes, category ids) stay."""
    if not has_norcal(model):
        raise NorcalError("the model has no NorCal node to strip")
    view = ModelView(model)
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
    view = ClassifierView(model)
    logits, hint = calibration.logits, None
    if has_norcal(model):
        if not logits or logits == view.meta.get(contract.LOGITS):
            hint = recorded_axis(view.meta)  # re-calibrating: the axis the node was on (None: last)
            hint = -1 if hint is None else hint
        logits = logits or view.meta.get(contract.LOGITS)
        view.strip()
    cands = view.classifiers(calibration, logits, hint)
    lp = calibration.log_prior().reshape(-1)
    axis = _common_axis(view, cands, calibration, lp.size)
    calibration = calibration.with_activation(cands[0].op_type.lower())
    _place_nodes(view, cands, calibration, lp, axis)
    view.meta.update(calibration_metadata(calibration))
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


def _common_axis(view: ClassifierView, cands: list[Candidate], calibration: Calibration, size: int) -> int:
    """Check the classifiers against the calibration (``size`` priors) and each other; their
    shared class axis counted from the end."""
    recorded = _recorded_width(view.meta)
    for cand in cands:
        width = cand.width or recorded  # a dynamic shape: what the export recorded
        if width is not None and width != size:
            raise NorcalError(f"the classifier {cand.node!r} has {width} logits per box but the "
                              f"calibration has {size} ({calibration.num_classes} classes from table, "
                              f"background {calibration.background!r})", param=("table", "background"))
    if len({c.op_type for c in cands}) != 1:
        raise NorcalError("the classifiers to calibrate mix Softmax and Sigmoid activations")
    if contract.recorded_background(view.meta) is None:  # a foreign graph: its own consumers may say
        for cand in cands:
            _check_background_in_graph(view, cand, calibration.background)
    axes = {_axis_from_end(view, c) for c in cands}
    if len(axes) != 1:
        raise NorcalError("the classifiers to calibrate have their classes on different axes")
    return axes.pop()


def _place_nodes(view: ClassifierView, cands: list[Candidate], calibration: Calibration, lp, axis: int) -> None:
    """Replace each candidate's activation by a NorCal node (or its inlined ops) on one shared
    prior ``lp``; the function and its domain join the graph unless inlined."""
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


def _recorded_width(meta: dict[str, str]) -> int | None:
    """Logits per box of a checkpoint export's classifier, from its metadata (class count and
    background slot), for graphs whose shapes leave the class axis dynamic (RetinaNet)."""
    n, background = meta.get(contract.NUM_CLASSES), contract.recorded_background(meta)
    if background is None or not (n or "").isdigit():
        return None
    return int(n) + (0 if background == "none" else 1)


def _axis_from_end(view: ModelView, cand: Candidate) -> int:
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


def _check_background_in_graph(view: ClassifierView, cand, background: str | None) -> None:
    """Refuse a background slot the graph contradicts: a softmax whose probabilities lose their
    first class column downstream has its background first (torchvision), its last column last
    (detectron2); NorCal on the wrong slot would silently rescale the background as a class."""
    if cand.op_type != "Softmax" or background not in ("first", "last"):
        return
    found = background_in_graph(view, cand)
    if found is not None and found[0] != background:
        slot, node = found
        column = "class column 0" if slot == "first" else "the last class column"
        raise NorcalError(f"the classifier {cand.node!r} puts its no-object logit {slot}: the graph drops "
                          f"{column} after the softmax ({node!r}); with background {background!r} NorCal "
                          f"would treat a class as that slot: give background {slot!r}", param="background")
