"""Lower-precision variants of an exported detector: int8 with explicit Q/DQ, and fp16.

int8 comes in two Q/DQ forms (:data:`norcal.core.contract.INT8_FORMS`, recorded as
``norcal.int8_form``). The ``tensorrt`` form is written the way TensorRT 10 consumes explicit quantization: QuantizeLinear /
DequantizeLinear pairs on the inputs of the convolutions and fully connected layers (a MatMul
that is no layer with weights, such as attention's q by k, stays fp32:
:func:`norcal.export.graph.fp32_region.weightless_products`), signed
int8, zero point 0 (symmetric), weights per output channel (the DequantizeLinear ``axis``),
activations per tensor, biases left in float (TensorRT has no int32 Q/DQ), no Q/DQ on the
layers' outputs (TensorRT fuses the pair into the next layer). The activation ranges come from
calibration images the caller feeds (:func:`quantize_int8`); ONNX Runtime's static quantizer
does the work. ONNX Runtime runs that form at fp32's speed: its CPU provider turns into int8
kernels only DequantizeLinear -> Conv/Gemm -> QuantizeLinear units. The ``ort`` form is that
one: Q/DQ on the layers' outputs too, activations uint8 with a zero point, weights int8
symmetric per output channel (U8S8, what ONNX Runtime's x86 int8 GEMMs take; with AVX512-VNNI or
AVX-VNNI there is no intermediate saturation) and biases int32, so ONNX Runtime's optimizer
fuses each unit into QLinearConv / QGemm. TensorRT does not build it (uint8 zero points, int32
biases). fp16 converts the same layers (and the elementwise ops between them) to
float16 with Casts at the boundary. Both keep :func:`norcal.export.graph.fp32_region.fp32_nodes`
in fp32: the NorCal node, the box predictor, decoding, NMS, TopK and the mask branch.

NVIDIA Model Optimizer (nvidia-modelopt) was tried first and is not used: its ONNX int8 path
pins onnx below this project's version, replaces onnxruntime by onnxruntime-gpu and cupy, and
its calibration rebuilds the graph without model-local functions, so ONNX Runtime then fails
on ``ai.norcal:NorCal`` ("is not a registered function/op").
"""

from __future__ import annotations

import logging
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, Literal

import numpy as np
import onnx

from norcal.core import contract
from norcal.core.errors import NorcalError
from norcal.export.graph.onnx_helpers import GraphIndex
from norcal.export.graph.fp32_region import (COMPUTE_OPS, fp32_nodes, mask_only_layers, name_nodes,
                                             weightless_products)

CalibrationMethod = Literal["minmax", "entropy", "percentile"]
Int8Form = Literal["tensorrt", "ort"]
CALIBRATION_METHODS = ("minmax", "entropy", "percentile")
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
# elementwise ops that run in fp16 when a value they read comes from an fp16 layer: the ReLUs,
# residual adds, padding masks and pools between the convolutions
FP16_FOLLOWERS = frozenset({"Relu", "Add", "Mul", "Sub", "MaxPool", "AveragePool", "Clip", "LeakyRelu"})


def check_fp32_model(model: onnx.ModelProto, where: str = "model") -> None:
    """Refuse a model that is already int8 or fp16: quantize the fp32 export."""
    meta = {p.key: p.value for p in model.metadata_props}
    done = meta.get(contract.PRECISION)
    if done is None and any(n.op_type in QDQ_OPS for n in model.graph.node):
        done = "quantized (it has QuantizeLinear/DequantizeLinear nodes)"
    if done is not None:
        raise NorcalError(f"{where} is already {done}: quantize the fp32 model it came from", param="model")
    if any(i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 for i in model.graph.input):
        raise NorcalError(f"{where} has float16 inputs: quantize the fp32 model it came from", param="model")


def _set_meta(model: onnx.ModelProto, values: dict[str, str]) -> None:
    kept = [(p.key, p.value) for p in model.metadata_props if p.key not in values]
    del model.metadata_props[:]
    for k, v in kept + list(values.items()):
        model.metadata_props.add(key=k, value=v)


@contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """ONNX Runtime's quantizer warns through the root logger (pre-processing hints, biases
    that are not initializers); the library reports through its own return values."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _own_bias_initializers(model: onnx.ModelProto) -> int:
    """Replace each Identity that copies an initializer by an initializer of its own (the
    exporter shares equal biases that way). ONNX Runtime fuses a Conv into QLinearConv only when
    its bias is an int32 initializer, and the quantizer quantizes initializers only. Returns
    how many were replaced."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    copies = [n for n in g.node if n.op_type == "Identity" and n.input[0] in inits]
    for n in copies:
        t = onnx.TensorProto()
        t.CopyFrom(inits[n.input[0]])
        t.name = n.output[0]
        g.initializer.append(t)
        g.node.remove(n)
    return len(copies)


# ops a layer's result passes through unchanged in kind on its way to the next layer
PASS_THROUGH = frozenset({"Relu", "Add", "Mul", "Sub", "MaxPool", "AveragePool", "Resize", "Clip", "LeakyRelu", "Split", "Slice",
                          "Reshape", "Flatten", "Transpose", "Concat", "Identity", "Squeeze", "Unsqueeze"})


def final_layers(model: onnx.ModelProto, quantized: set[str]) -> set[str]:
    """The layers of ``quantized`` whose result reaches no other layer of ``quantized`` (through
    :data:`PASS_THROUGH` ops): the RPN's objectness and box-delta convolutions, the box head's
    last fully connected layer. Their results go to float arithmetic that ranks proposals,
    decodes boxes or computes the classifier's logits, so the ort form keeps them float: a
    per-tensor uint8 rounding of an objectness map or of the box predictor's features costs
    AP; their inputs are still int8-rounded, as in the tensorrt form."""
    consumers = GraphIndex.of(model.graph).consumers
    final = set()
    for n in model.graph.node:
        if n.name not in quantized:
            continue
        todo, seen, feeds_layer = list(n.output), set(), False
        while todo and not feeds_layer:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            for c in consumers.get(t, ()):
                if c.name in quantized:
                    feeds_layer = True
                elif c.op_type in PASS_THROUGH:
                    todo.extend(o for o in c.output if o)
        if not feeds_layer:
            final.add(n.name)
    return final


def _quantize_options(form: str) -> dict:
    """quantize_static's keyword arguments for one form."""
    from onnxruntime.quantization import QuantFormat, QuantType

    common = dict(quant_format=QuantFormat.QDQ, op_types_to_quantize=list(COMPUTE_OPS), per_channel=True,
                  weight_type=QuantType.QInt8)
    if form == "tensorrt":
        return dict(common, activation_type=QuantType.QInt8, extra_options={
            "ActivationSymmetric": True, "WeightSymmetric": True,  # zero point 0
            "QuantizeBias": False,  # TensorRT dequantizes no int32
            "OpTypesToExcludeOutputQuantization": list(COMPUTE_OPS),
        })
    # ONNX Runtime: uint8 activations (asymmetric: a ReLU's output uses all 256 levels), int8
    # symmetric weights, int32 biases, Q on every layer's output: DQ -> Conv -> Q units
    return dict(common, activation_type=QuantType.QUInt8, extra_options={
        "ActivationSymmetric": False, "WeightSymmetric": True})


def quantize_int8(model: onnx.ModelProto, calibration: Iterable[dict[str, np.ndarray]],
                  method: CalibrationMethod = "minmax", where: str = "model",
                  on_batch: Callable[[int], None] | None = None, form: Int8Form = "tensorrt",
                  mask_head: bool = False) -> tuple[onnx.ModelProto, int]:
    """The explicit-quantization (Q/DQ) int8 model and the number of calibration images used.

    calibration: input feeds (``images``, ``image_sizes`` as the runners get them), each one
    batch, prepared exactly as at inference; on_batch(n) is called after each batch of n
    images. method: how activation ranges are taken from the calibration outputs (minmax:
    the observed range; entropy / percentile: clipped, ONNX Runtime's calibrators).
    form: ``tensorrt`` (for ``norcal build``) or ``ort`` (int8 kernels in ONNX Runtime's CPU
    provider). mask_head: also quantize the mask head's layers (they feed the masks only, so
    boxes, scores and classes are as without; the ConvTranspose stays fp32).
    """
    # onnxruntime is an extra (cpu / gpu builds): imported where used, as by _int8_meta for its version
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod as OrtMethod, quantize_static

    if method not in CALIBRATION_METHODS:
        raise NorcalError(f"calibration method {method!r}: choose one of {', '.join(CALIBRATION_METHODS)}",
                          param="method")
    if form not in contract.INT8_FORMS:
        raise NorcalError(f"int8 form {form!r}: choose one of {', '.join(contract.INT8_FORMS)}", param="form")
    check_fp32_model(model, where)
    work, keep, products, int8_masks = _int8_plan(model, where, form, mask_head)
    count = [0]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(calibration)

        def get_next(self):
            feeds = next(self.it, None)
            if feeds is None:
                return None
            n = len(feeds["images"])
            count[0] += n
            if on_batch:
                on_batch(n)
            return feeds

    ort_method = {"minmax": OrtMethod.MinMax, "entropy": OrtMethod.Entropy,
                  "percentile": OrtMethod.Percentile}[method]
    with tempfile.TemporaryDirectory(prefix="norcal-quantize-") as tmp, _quiet_root_logger():
        out = Path(tmp) / "int8.onnx"
        try:
            quantize_static(work, str(out), Reader(), nodes_to_exclude=sorted(keep),
                            calibrate_method=ort_method, **_quantize_options(form))
        except ValueError as e:
            if count[0] == 0:
                raise NorcalError(f"{where}: no calibration images were given", param="images") from None
            raise NorcalError(f"{where}: ONNX Runtime could not quantize it ({str(e).splitlines()[0]})") from None
        quantized = onnx.load(str(out))
    if count[0] == 0:
        raise NorcalError(f"{where}: no calibration images were given", param="images")
    _set_meta(quantized, _int8_meta(work, form, method, keep, products, int8_masks, count[0]))
    return quantized, count[0]


def _int8_plan(model: onnx.ModelProto, where: str, form: str,
               mask_head: bool) -> tuple[onnx.ModelProto, set[str], set[str], set[str]]:
    """The copy to quantize (nodes named; the ort form's biases its own initializers) and the
    node sets: kept fp32, the weightless MatMuls among them, the mask layers made int8."""
    work = onnx.ModelProto()
    work.CopyFrom(model)
    name_nodes(work)
    if form == "ort":
        _own_bias_initializers(work)
    products = weightless_products(work)
    keep = fp32_nodes(work, where) | products
    int8_masks = mask_only_layers(work) & keep if mask_head else set()
    keep -= int8_masks
    if form == "ort":
        layers = {n.name for n in work.graph.node if n.op_type in COMPUTE_OPS} - keep
        keep |= final_layers(work, layers) - int8_masks
    return work, keep, products, int8_masks


def _int8_meta(work: onnx.ModelProto, form: str, method: str, keep: set[str], products: set[str],
               int8_masks: set[str], images: int) -> dict[str, str]:
    """The metadata an int8 model records: precision, form, how it was quantized, images used."""
    import onnxruntime

    how = ("QDQ int8 symmetric, weights per channel, activations per tensor" if form == "tensorrt" else
           "QDQ on layer inputs and outputs, activations uint8 per tensor, weights int8 symmetric per "
           "channel, int32 biases")
    kept = _kept_region(work) + (f"; mask head int8 ({len(int8_masks)} layers)"
                                                         if int8_masks else _masks_kept(work))
    return {
        contract.PRECISION: "int8",
        contract.INT8_FORM: form,
        contract.QUANTIZATION: (f"onnxruntime {onnxruntime.__version__} quantize_static ({form} form): {how}, "
                                f"{method} calibration; {len(keep)} nodes kept fp32 ({kept})"
                                + (f"; {len(products)} MatMuls without weights fp32 (attention and the like)" if products else "")),
        contract.CALIBRATION_IMAGES: str(images),
    }


def _ops(graphs: Iterable[onnx.GraphProto]) -> set[str]:
    """Op types of the graphs' nodes and of their subgraphs (If / Loop bodies)."""
    ops: set[str] = set()
    for g in graphs:
        for n in g.node:
            ops.add(n.op_type)
            ops |= _ops(a.g for a in n.attribute if a.type == onnx.AttributeProto.GRAPH)
            ops |= _ops(sub for a in n.attribute for sub in a.graphs)
    return ops


def _kept_region(model: onnx.ModelProto) -> str:
    """What the recorded description says stays fp32: NMS where the graph has it, the top-k
    where it selects without (an RT-DETR's decoder: one box per query)."""
    has_nms = "NonMaxSuppression" in _ops([model.graph]) or any(
        n.op_type == "NonMaxSuppression" for f in model.functions for n in f.node)
    return "classifier layers, NorCal, decoding, " + ("NMS" if has_nms else "top-k")


def _masks_kept(model: onnx.ModelProto) -> str:
    """", masks" for a graph with the masks output (the recorded description names only what
    the graph has: a detect-only YOLO or Faster R-CNN has no mask branch)."""
    return ", masks" if any(o.name == "masks" for o in model.graph.output) else ""


def fp16_nodes(model: onnx.ModelProto, keep: set[str]) -> set[str]:
    """The nodes an fp16 model computes in fp16: every Conv/Gemm/MatMul (and ConvTranspose) not
    in ``keep``, and the elementwise ops (:data:`FP16_FOLLOWERS`) that read their results."""
    half: set[str] = set()
    half_tensors: set[str] = set()
    for n in model.graph.node:  # ONNX graphs are topologically sorted
        if n.name in keep:
            continue
        if n.op_type in COMPUTE_OPS + ("ConvTranspose",) or \
                (n.op_type in FP16_FOLLOWERS and any(i in half_tensors for i in n.input)):
            half.add(n.name)
            half_tensors.update(n.output)
    return half


def convert_fp16(model: onnx.ModelProto, where: str = "model") -> onnx.ModelProto:
    """The mixed-precision model: the backbone, FPN, RPN and box head in fp16, the fp32 region
    (:func:`norcal.export.graph.fp32_region.fp32_nodes`) and the graph inputs and outputs in fp32.

    Written here rather than with onnxconverter-common: its node block list assumes blocked
    nodes are islands in an fp16 graph, while here fp16 is the island (it left the stem
    convolution with an fp32 weight and an fp16 input). The rule is simple: an fp16 node reads
    fp16 initializers (converted, clipped to fp16's range) or fp16 values (a Cast inserted
    where an fp32 node wrote them), and a Cast back to fp32 sits before every fp32 reader.
    """
    from onnx import TensorProto, helper

    check_fp32_model(model, where)
    work = onnx.ModelProto()
    work.CopyFrom(model)
    name_nodes(work)
    g = work.graph
    half = fp16_nodes(work, fp32_nodes(work, where))
    readers = GraphIndex.of(g).consumers
    half_out = {o for n in g.node if n.name in half for o in n.output if o}
    new_nodes, converted = _half_inputs(g, half, half_out, readers)
    back = _rename_half_outputs(g, half, half_out, readers)
    order = []
    for n in new_nodes:
        order.append(n)
        for o in n.output:
            if o in back:
                order.append(helper.make_node("Cast", [o], [back[o]], to=TensorProto.FLOAT,
                                              name=f"{back[o]}__cast_fp32"))
    del g.node[:]
    g.node.extend(order)
    stale = half_out | set(converted)
    kept_info = [v for v in g.value_info if v.name not in stale]
    del g.value_info[:]
    g.value_info.extend(kept_info)
    _set_meta(work, {
        contract.PRECISION: "fp16",
        contract.QUANTIZATION: (f"fp16: {len(half)} nodes (convolutions, fully connected layers and the "
                                f"elementwise ops between them); {_kept_region(work)}"
                                f"{_masks_kept(work)} and the graph I/O fp32"),
    })
    return work


def _half_inputs(g: onnx.GraphProto, half: set[str], half_out: set[str],
                 readers: dict) -> tuple[list[onnx.NodeProto], set[str]]:
    """Give the fp16 nodes fp16 inputs: initializers read by fp16 nodes only are converted
    (clipped to fp16's range), other fp32 values get a Cast. Returns the nodes in order with the
    Casts, and the converted initializers' names."""
    from onnx import TensorProto, helper, numpy_helper

    inits = {t.name: t for t in g.initializer}
    finfo = np.finfo(np.float16)
    new_nodes: list[onnx.NodeProto] = []
    to_half: dict[str, str] = {}  # fp32 tensor -> its fp16 cast
    converted: set[str] = set()
    for n in g.node:
        if n.name in half:
            for k, t in enumerate(n.input):
                if not t or t in half_out:
                    continue
                if t in inits and all(r.name in half for r in readers[t]):
                    if t not in converted:
                        arr = np.clip(numpy_helper.to_array(inits[t]), finfo.min, finfo.max)
                        inits[t].CopyFrom(numpy_helper.from_array(arr.astype(np.float16), t))
                        converted.add(t)
                    continue
                if t not in to_half:
                    to_half[t] = f"{t}__fp16"
                    new_nodes.append(helper.make_node("Cast", [t], [to_half[t]], to=TensorProto.FLOAT16,
                                                      name=f"{t}__cast_fp16"))
                n.input[k] = to_half[t]
        new_nodes.append(n)
    return new_nodes, converted


def _rename_half_outputs(g: onnx.GraphProto, half: set[str], half_out: set[str], readers: dict) -> dict[str, str]:
    """Rename each fp16 value that an fp32 node (or the graph's output) reads, among its fp16
    writers and readers; returns {fp16 name: the fp32 name its Cast back writes}."""
    graph_outputs = {o.name for o in g.output}
    back: dict[str, str] = {}
    for t in sorted(half_out):
        fp32_readers = [r for r in readers.get(t, []) if r.name not in half]
        if not fp32_readers and t not in graph_outputs:
            continue
        half_name = f"{t}__fp16out"
        for n in g.node:
            if n.name in half:
                n.output[:] = [half_name if o == t else o for o in n.output]
        for r in readers.get(t, []):
            if r.name in half:
                r.input[:] = [half_name if i == t else i for i in r.input]
        back[half_name] = t
    return back
