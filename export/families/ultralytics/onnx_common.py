"""What the ingest of Ultralytics' ONNX exports (YOLO: :mod:`.onnx_yolo`, RT-DETR:
:mod:`.onnx_rtdetr`) shares: recognising the graph and reading its metadata, its image input made
static for shape inference, the network cut at the head's tensors, and our traced
post-processing joined to it as one model."""

from __future__ import annotations

import ast

import onnx

from norcal.core import contract
from norcal.core.errors import NorcalError
from norcal.export.graph.onnx_helpers import GraphIndex, default_opset
from norcal.export.pytorch.onnx_trace import MIN_OPSET

AUTHOR = "Ultralytics"
POST_PREFIX = "norcal_post/"  # names of the appended post-processing's inner nodes and tensors
SCALED = "norcal_ingest/images_01"  # the Div's output: Ultralytics' graph wants pixels in 0-1


def graph_metadata(model: onnx.ModelProto) -> dict[str, str]:
    """The graph's metadata_props as a dict."""
    return {p.key: p.value for p in model.metadata_props}


def is_ultralytics(model: onnx.ModelProto) -> bool:
    """Whether ``model`` says it was exported by Ultralytics (metadata author)."""
    return graph_metadata(model).get("author") == AUTHOR


def metadata_literal(meta: dict[str, str], key: str, where: str):
    """The Python literal an Ultralytics metadata value holds (its ``names``, ``imgsz``, ``args``)."""
    try:
        return ast.literal_eval(meta[key])
    except KeyError:
        raise NorcalError(f"{where}: an Ultralytics graph without its {key!r} metadata") from None
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise NorcalError(f"{where}: Ultralytics metadata {key!r} is not readable: {meta[key][:80]!r}") from None


def class_names(meta: dict[str, str], where: str) -> list[str]:
    """The class names of Ultralytics' ``names`` metadata, in index order."""
    raw = metadata_literal(meta, "names", where)
    if isinstance(raw, dict):
        keys = sorted(raw, key=lambda k: int(k) if isinstance(k, (int, str)) and str(k).isdigit() else -1)
        if [str(k) for k in keys] != [str(i) for i in range(len(raw))]:
            raise NorcalError(f"{where}: Ultralytics metadata 'names' is not indexed 0..{len(raw) - 1}")
        names = [str(raw[k]) for k in keys]
    elif isinstance(raw, (list, tuple)):
        names = [str(n) for n in raw]
    else:
        raise NorcalError(f"{where}: Ultralytics metadata 'names' is a {type(raw).__name__}, not a dict of class names")
    if not names:
        raise NorcalError(f"{where}: Ultralytics metadata 'names' lists no classes")
    return names


def square_imgsz(meta: dict[str, str], where: str) -> int:
    """The square input side of Ultralytics' ``imgsz`` metadata; a non-square one is refused."""
    raw = metadata_literal(meta, "imgsz", where)
    sizes = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    if not sizes or any(not isinstance(s, int) or isinstance(s, bool) or s <= 0 for s in sizes):
        raise NorcalError(f"{where}: Ultralytics metadata 'imgsz' is {meta['imgsz']!r}, not a positive size")
    if len(set(sizes)) != 1:
        raise NorcalError(f"{where}: exported at a non-square imgsz {sizes}; our letterbox input is square")
    return int(sizes[0])


def static_input(model: onnx.ModelProto, size: int, where: str, batch: int | None = None) -> onnx.ModelProto:
    """A copy whose one image input is [batch, 3, size, size] (the batch dim kept unless given)."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    if len(inputs) != 1:
        raise NorcalError(f"{where}: an Ultralytics graph with {len(inputs)} inputs "
                          f"({', '.join(i.name for i in inputs)}); expected one image input")
    dims = inputs[0].type.tensor_type.shape.dim
    if len(dims) != 4 or (dims[1].HasField("dim_value") and dims[1].dim_value != 3):
        raise NorcalError(f"{where}: input {inputs[0].name!r} is not an image batch [B, 3, H, W]")
    for d, v in ((dims[2], size), (dims[3], size)):
        if d.HasField("dim_value") and d.dim_value != v:
            raise NorcalError(f"{where}: input {inputs[0].name!r} is fixed at {d.dim_value} but the metadata's "
                              f"imgsz is {size}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    dims = out.graph.input[[i.name for i in out.graph.input].index(inputs[0].name)].type.tensor_type.shape.dim
    dims[1].Clear()
    dims[1].dim_value = 3
    # shape inference only: a dynamic batch hides the anchor count (a fixed one stays: the
    # graph's reshapes hold it)
    if batch is not None and not dims[0].HasField("dim_value"):
        dims[0].Clear()
        dims[0].dim_value = batch
    for k in (2, 3):
        dims[k].Clear()
        dims[k].dim_value = size
    return out


def cut_network(model: onnx.ModelProto, wanted: list[str]) -> onnx.GraphProto:
    """Ultralytics' nodes that the ``wanted`` tensors need (its NMS and score Concat dropped),
    with the image input scaled 0-255 -> 0-1 in front."""
    g = model.graph
    producer = GraphIndex.of(g).position
    keep, stack = set(), list(wanted)
    while stack:
        t = stack.pop()
        i = producer.get(t)
        if i is None or i in keep:
            continue
        keep.add(i)
        node = g.node[i]
        stack.extend(node.input)
        for a in node.attribute:  # outer-scope names a subgraph reads
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                stack.extend(x for n in sub.node for x in n.input)
    image = next(i.name for i in g.input if i.name not in {x.name for x in g.initializer})
    out = onnx.GraphProto()
    out.name = g.name or "ultralytics"
    scale = onnx.helper.make_tensor("norcal_ingest/255", onnx.TensorProto.FLOAT, [], [255.0])
    out.node.append(onnx.helper.make_node("Div", [image, scale.name], [SCALED], name="norcal_ingest/Div"))
    for i in sorted(keep):
        node = onnx.NodeProto()
        node.CopyFrom(g.node[i])
        for k, x in enumerate(node.input):
            if x == image:
                node.input[k] = SCALED
        out.node.append(node)
    used = {x for n in out.node for x in n.input}
    out.initializer.extend([scale, *(t for t in g.initializer if t.name in used)])
    out.sparse_initializer.extend(t for t in g.sparse_initializer if t.values.name in used)
    return out


def _prefixed(post: onnx.GraphProto, io_map: dict[str, str]) -> tuple[list, list]:
    """The post graph's nodes and initializers with inner names prefixed and its inputs mapped
    onto Ultralytics' tensors; the contract's outputs and ``cls_logits`` keep their names."""
    keep = {o.name for o in post.output} | {contract.CLS_LOGITS_TENSOR, "image_sizes"}

    def rename(name: str) -> str:
        if not name or name in keep:
            return name
        return io_map.get(name, POST_PREFIX + name)

    nodes = []
    for n in post.node:
        node = onnx.NodeProto()
        node.CopyFrom(n)
        node.name = POST_PREFIX + (n.name or n.op_type)
        node.input[:] = [rename(x) for x in n.input]
        node.output[:] = [rename(x) for x in n.output]
        nodes.append(node)
    inits = []
    for t in post.initializer:
        init = onnx.TensorProto()
        init.CopyFrom(t)
        init.name = rename(t.name)
        inits.append(init)
    return nodes, inits


def at_least_opset(model: onnx.ModelProto, where: str) -> tuple[onnx.ModelProto, int]:
    """``model`` at opset >= MIN_OPSET (converted when older) and its opset."""
    opset = default_opset(model, required=False)
    if opset >= MIN_OPSET:
        return model, opset
    from onnx import version_converter

    try:
        model = version_converter.convert_version(model, MIN_OPSET)
    except Exception as e:  # the converter's own errors are of many kinds
        raise NorcalError(f"{where}: the Ultralytics graph (opset {opset}) could not be converted to opset "
                          f"{MIN_OPSET} ({type(e).__name__}); export it with opset >= {MIN_OPSET}") from None
    return model, MIN_OPSET


def assemble(static: onnx.ModelProto, body: onnx.GraphProto, post: onnx.ModelProto, io_map: dict[str, str],
             topk: int, opset: int) -> onnx.ModelProto:
    """The cut Ultralytics network ``body`` and our traced ``post`` graph (its inputs mapped
    onto the network's tensors by ``io_map``) as one model: inputs ``images`` (Ultralytics'
    image input) and ``image_sizes``, the contract's outputs padded to ``topk``; a static
    export's fixed batch fixes every input and output's batch."""
    nodes, inits = _prefixed(post.graph, io_map)
    body.node.extend(nodes)
    body.initializer.extend(inits)
    image = next(i for i in static.graph.input if i.name not in {x.name for x in static.graph.initializer})
    sizes = next(i for i in post.graph.input if i.name == "image_sizes")
    body.input.extend([image, sizes])
    fixed = image.type.tensor_type.shape.dim[0]
    fixed = fixed.dim_value if fixed.HasField("dim_value") else None  # a static export: batch fixed
    if fixed is not None:
        body.input[1].type.tensor_type.shape.dim[0].dim_value = fixed
    for out in post.graph.output:
        if out.name == contract.CLS_LOGITS_TENSOR:
            continue
        o = onnx.ValueInfoProto()
        o.CopyFrom(out)
        dims = o.type.tensor_type.shape.dim
        if fixed is not None and dims:
            dims[0].dim_value = fixed
        if out.name not in ("num_detections", contract.MASK_PROTOS) and len(dims) >= 2:  # padded to K
            dims[1].Clear()
            dims[1].dim_value = topk
        body.output.append(o)
    opsets = {o.domain: o.version for o in static.opset_import}
    for o in post.opset_import:
        opsets[o.domain] = max(opsets.get(o.domain, 0), o.version)
    opsets[""] = opset
    opsets.pop("ai.onnx", None)
    merged = onnx.helper.make_model(body, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()],
                                    producer_name="norcal-deploy")
    merged.ir_version = max(static.ir_version, post.ir_version)
    merged.functions.extend(static.functions)
    return merged
