"""One ONNX model under surgery: its onnx-graphsurgeon graph, metadata and inferred types; taking
a NorCal node out of it, and exporting it back to a model with what graphsurgeon drops restored."""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs

from norcal.core import contract
from norcal.core.errors import NorcalError
from norcal.export.graph.onnx_helpers import default_opset, inferred_types


class ModelView:
    """One model under surgery: its graphsurgeon graph, metadata and (once) inferred types."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.opset = default_opset(model)
        self.graph = gs.import_onnx(model)
        # graphsurgeon keeps the model's own opset_import field here: copy it, the model stays as it is
        self.graph.import_domains = [onnx.helper.make_opsetid(o.domain, o.version) for o in model.opset_import]
        self.meta = {p.key: p.value for p in model.metadata_props}
        self.types = inferred_types(model)

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


def recorded_axis(meta: dict[str, str]) -> int | None:
    """The class axis a NorCal node's metadata records (None: the last axis)."""
    raw = meta.get(contract.CLASS_AXIS)
    if raw is None:
        return None
    if not raw.isdigit():
        raise NorcalError(f"model metadata {contract.CLASS_AXIS}={raw!r} is not an axis index")
    return int(raw)


def has_norcal(model: onnx.ModelProto) -> bool:
    """Whether ``model`` has a NorCal node (or its inlined ops)."""
    return any(_is_norcal_node(n.op_type, n.domain, n.name) for n in model.graph.node)


def _is_norcal_node(op_type: str, domain: str | None, name: str) -> bool:
    return ((domain == contract.NODE_DOMAIN and op_type == contract.NODE_OP_TYPE)
            or (name or "").startswith(contract.INLINE_PREFIX))
