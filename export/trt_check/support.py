"""What the TensorRT 10.15 ONNX parser accepts: its operator support matrix and static limits.

The matrix below is onnx-tensorrt's ``docs/operators.md`` for TensorRT 10.15 (one row per
operator: ``Name | types | restrictions``, or ``Name | N`` when unsupported), as compiled in
``docs/tensorrt_onnx_support.md``. The limits after it come from the same file
(importer and checker code, TensorRT operator docs); each says where it comes from.
Keep it as data in code, not a JSON file, so it ships in every wheel without package-data.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx import TensorProto

TENSORRT_VERSION = "10.15"
OPSET_MIN, OPSET_MAX = 9, 24  # "TensorRT 10.15 supports operators in the inclusive range of opset 9 to opset 24"

_MATRIX = """
Abs | FP32, FP16, BF16, INT32, INT64
Acos | FP32, FP16, BF16
Acosh | FP32, FP16, BF16
Add | FP32, FP16, BF16, INT32, INT64
AffineGrid | N
And | BOOL
ArgMax | FP32, FP16, BF16, INT32, INT64
ArgMin | FP32, FP16, BF16, INT32, INT64
Asin | FP32, FP16, BF16
Asinh | FP32, FP16, BF16
Atan | FP32, FP16, BF16
Atanh | FP32, FP16, BF16
Attention | FP32, FP16, BF16, INT8, FP8 | `Q`, `K`, `V` and `attn_mask` must be 4D. `past_key`, `past_value` and `nonpad_kv_seqlen` inputs are unsupported. `present_key`, `present_value` and `qk_matmul_output` outputs are unsupported. `qk_matmul_output_mode` and `softcap` attributes are unsupported. `q_num_heads` and `kv_num_heads` attributes are supported via being specified as the second dimension of `Q` and `K`/`V`'s shapes respectively.
AveragePool | FP32, FP16, BF16 | 2D or 3D Pooling only. `dilations` must be empty or all ones
BatchNormalization | FP32, FP16, BF16
Bernoulli | N
BitShift | N
BitwiseAnd | N
BitwiseNot | N
BitwiseOr | N
BitwiseXor | N
BlackmanWindow | FP32, FP16
Cast | FP32, FP16, BF16, INT32, INT64, UINT8, BOOL
CastLike | FP32, FP16, BF16, INT32, INT64, UINT8, BOOL
Ceil | FP32, FP16, BF16
Col2Im | N
Celu | FP32, FP16, BF16
CenterCropPad | N
Clip | FP32, FP16, BF16
Compress | N
Concat | FP32, FP16, BF16, INT32, INT64, BOOL
ConcatFromSequence | N
Constant | FP32, FP16, BF16, FP8, FP4, INT4, INT32, INT64, BOOL | `sparse_value`, `value_string`, and `value_strings` attributes are unsupported.
ConstantOfShape | FP32, FP16, BF16, FP8, FP4, INT4, INT32, INT64, BOOL
Conv | FP32, FP16, BF16
ConvInteger | N
ConvTranspose | FP32, FP16, BF16
Cos | FP32, FP16, BF16
Cosh | FP32, FP16, BF16
CumSum | FP32, FP16, BF16 | `axis` must be a build-time constant
DFT | N
DeformConv | FP32, FP16 | `input` must have 1D or 2D spatial dimensions. `pads` for the beginning and end along each spatial axis must be the same
DepthToSpace | FP32, FP16, BF16, INT32, INT64
DequantizeLinear | INT8, FP8, FP4, INT4 | `x_zero_point` must be zero
Det | N
Div | FP32, FP16, BF16, INT32, INT64
Dropout | FP32, FP16, BF16 | `is_training` must be an initializer and evaluate to False.
DynamicQuantizeLinear | N | Not supported. TensorRT's IDynamicQuantize can be composed from ONNX operators in the form of a model local function.
Einsum | FP32, FP16, BF16
Elu | FP32, FP16, BF16
Equal | FP32, FP16, BF16, INT32, INT64
Erf | FP32, FP16, BF16
Exp | FP32, FP16, BF16
Expand | FP32, FP16, BF16, INT32, INT64, BOOL
EyeLike | FP32, FP16, BF16, INT32, INT64, BOOL | `input` must have static dimensions
Flatten | FP32, FP16, BF16, INT32, INT64, BOOL
Floor | FP32, FP16, BF16
Gather | FP32, FP16, BF16, INT32, INT64, BOOL
GatherElements | FP32, FP16, BF16, INT32, INT64, BOOL
GatherND | FP32, FP16, BF16, INT32, INT64, BOOL
Gelu | FP32, FP16, BF16, INT8, INT32, INT64
Gemm | FP32, FP16, BF16
GlobalAveragePool | FP32, FP16, BF16
GlobalLpPool | FP32, FP16, BF16
GlobalMaxPool | FP32, FP16, BF16
Greater | FP32, FP16, BF16, INT32, INT64
GreaterOrEqual | FP32, FP16, BF16, INT32, INT64
GridSample | FP32, FP16 | Input must be 4D input.
GroupNormalization | FP32, FP16, BF16
GRU | FP32, FP16, BF16 | For bidirectional GRUs, activation functions must be the same for both the forward and reverse pass
HammingWindow | FP32, FP16
HannWindow | FP32, FP16
HardSigmoid | FP32, FP16, BF16
HardSwish | FP32, FP16, BF16
Hardmax | FP32, FP16, BF16 | `axis` dimension of input must be a build-time constant
Identity | FP32, FP16, BF16, INT32, INT64, BOOL
If | FP32, FP16, BF16, INT32, INT64, BOOL | Output tensors of the two conditional branches must have the same rank and must have different names
ImageScaler | FP32, FP16, BF16
ImageDecoder | N
InstanceNormalization | FP32, FP16, BF16
IsInf | FP32, FP16, BF16
IsNaN | FP32, FP16, BF16, INT32, INT64
LayerNormalization | FP32, FP16, BF16 | Only the first output `Y` is supported.
LeakyRelu | FP32, FP16, BF16
Less | FP32, FP16, BF16, INT32, INT64
LessOrEqual | FP32, FP16, BF16, INT32, INT64
Log | FP32, FP16, BF16
LogSoftmax | FP32, FP16, BF16
Loop | FP32, FP16, BF16, INT32, INT64, BOOL | Scan output length cannot be dynamic. The shape of Loop carried dependencies must be the same across all loop iterations.
LRN | FP32, FP16, BF16
LSTM | FP32, FP16, BF16 | For bidirectional LSTMs, activation functions must be the same for both the forward and reverse pass. `input_forget` attribute must be 0. `layout` attribute must be 0.
LpNormalization | FP32, FP16, BF16
LpPool | FP32, FP16, BF16 | `dilations` must be empty or all ones
MatMul | FP32, FP16, BF16
MatMulInteger | N
Max | FP32, FP16, BF16, INT32, INT64
MaxPool | FP32, FP16, BF16 | 2D or 3D pooling only. `Indices` output tensor unsupported. `dilations` must be empty or all ones
MaxRoiPool | N
MaxUnpool | N
Mean | FP32, FP16, BF16, FP8, INT32, INT64
MeanVarianceNormalization | FP32, FP16, BF16
MelWeightMatrix | N
Min | FP32, FP16, BF16, INT32, INT64
Mish | FP32, FP16
Mod | FP32, FP16, BF16, INT32, INT64
Mul | FP32, FP16, BF16, INT32, INT64
Multinomial | N
Neg | FP32, FP16, BF16, INT32, INT64
NegativeLogLikelihoodLoss | N
NonMaxSuppression | FP32, FP16
NonZero | FP32, FP16
Not | BOOL
OneHot | FP32, FP16, BF16, INT32, INT64, BOOL | `depth` must be a build-time constant
Optional | N
OptionalGetElement | N
OptionalHasElement | N
Or | BOOL
Pad | FP32, FP16, BF16, INT32, INT64
ParametricSoftplus | FP32, FP16, BF16
Pow | FP32, FP16, BF16, INT32, INT64
PRelu | FP32, FP16, BF16
QLinearConv | N
QLinearMatMul | N
QuantizeLinear | FP32, FP16, BF16 | `y_zero_point` must be 0
RandomNormal | FP32, FP16, BF16 | `seed` value is ignored by TensorRT
RandomNormalLike | FP32, FP16, BF16 | `seed` value is ignored by TensorRT
RandomUniform | FP32, FP16, BF16 | `seed` value is ignored by TensorRT
RandomUniformLike | FP32, FP16, BF16 | `seed` value is ignored by TensorRT
Range | FP32, FP16, BF16, INT32, INT64
Reciprocal | FP32, FP16, BF16
ReduceL1 | FP32, FP16, BF16, INT32, INT64 | `axes` must be an initializer
ReduceL2 | FP32, FP16, BF16, INT32, INT64 | `axes` must be an initializer
ReduceLogSum | FP32, FP16, BF16, INT32, INT64 | `axes` must be an initializer
ReduceLogSumExp | FP32, FP16, BF16, INT32, INT64 | `axes` must be an initializer
ReduceMax | FP32, FP16, BF16, INT32, INT64 | `axes` must be an initializer
ReduceMean | FP32, FP16, BF16, INT32, INT64 | `axes` must be an initializer
ReduceMin | FP32, FP16, BF16, INT32, INT64 | `axes` must be an initializer
ReduceProd | FP32, FP16, BF16, INT32, INT64 | `axes` must be an initializer
ReduceSum | FP32, FP16, BF16, INT32, INT64 | `axes` must be an initializer
ReduceSumSquare | FP32, FP16, BF16, INT32, INT64 | `axes` must be an initializer
RegexFullMatch | N
Relu | FP32, FP16, BF16, INT32, INT64
Reshape | FP32, FP16, BF16, INT32, INT64, BOOL
Resize | FP32, FP16, BF16 | Supported resize transformation modes: `half_pixel`, `pytorch_half_pixel`, `tf_half_pixel_for_nn`, `asymmetric`, and `align_corners`. Supported resize modes: `nearest`, `linear`. Supported nearest modes: `floor`, `ceil`, `round_prefer_floor`, `round_prefer_ceil`. Supported aspect ratio policy: `stretch`. When `scales` is a tensor input, `axes` must be an iota vector of length rank(input). Antialiasing is not supported.
ReverseSequence | FP32, FP16, BF16, INT32, INT64, BOOL
RMSNormalization | FP32, FP16, BF16
RNN | FP32, FP16, BF16 | For bidirectional RNNs, activation functions must be the same for both the forward and reverse pass
RoiAlign | FP32, FP16
RotaryEmbedding | FP32, FP16, BF16 | `position_ids` must be INT64
Round | FP32, FP16, BF16
STFT | FP32 | `frame_step` and `window` must be an initializer. Input must be real-valued.
ScaledTanh | FP32, FP16, BF16
Scan | FP32, FP16, BF16
Scatter | FP32, FP16, BF16, INT32, INT64
ScatterElements | FP32, FP16, BF16, INT32, INT64
ScatterND | FP32, FP16, BF16, INT32, INT64 | `reduction` other than `none` is not supported
Selu | FP32, FP16, BF16
SequenceAt | N
SequenceConstruct | N
SequenceEmpty | N
SequenceErase | N
SequenceInsert | N
SequenceLength | N
SequenceMap | N
Shape | FP32, FP16, BF16, INT32, INT64, BOOL
Shrink | FP32, FP16, BF16, INT32, INT64
Sigmoid | FP32, FP16, BF16
Sign | FP32, FP16, BF16, INT32, INT64
Sin | FP32, FP16, BF16
Sinh | FP32, FP16, BF16
Size | FP32, FP16, BF16, INT32, INT64, BOOL
Slice | FP32, FP16, BF16, INT32, INT64, BOOL
Softmax | FP32, FP16, BF16
SoftmaxCrossEntropyLoss | N
Softplus | FP32, FP16, BF16
Softsign | FP32, FP16, BF16
SpaceToDepth | FP32, FP16, BF16, INT32, INT64
Split | FP32, FP16, BF16, INT32, INT64, BOOL
SplitToSequence | N
Sqrt | FP32, FP16, BF16
Squeeze | FP32, FP16, BF16, INT32, INT64, BOOL | `axes` must be resolvable to a constant.
StringConcat | N
StringNormalizer | N
StringSplit | N
Sub | FP32, FP16, BF16, INT32, INT64
Sum | FP32, FP16, BF16, INT32, INT64
Tan | FP32, FP16, BF16
Tanh | FP32, FP16, BF16
TensorScatter | FP32, FP16, BF16, INT32 | `past_cache` and `update` must be 4D. `axis` must be -2.
TfIdfVectorizer | N
ThresholdedRelu | FP32, FP16, BF16
Tile | FP32, FP16, BF16, INT32, INT64, BOOL
TopK | FP32, FP16, BF16, INT32, INT64 | `sorted` must be 1. `K` input must be less than 3840.
Transpose | FP32, FP16, BF16, INT32, INT64, BOOL
Trilu | FP32, FP16, BF16, INT32, INT64, BOOL
Unique | N
Unsqueeze | FP32, FP16, BF16, INT32, INT64, BOOL | `axes` must be resolvable to a constant.
Upsample | FP32, FP16, BF16
Where | FP32, FP16, BF16, INT32, INT64, BOOL
Xor | BOOL
"""


@dataclass(frozen=True)
class OpSupport:
    """One row of the support matrix."""

    name: str
    supported: bool
    types: frozenset[str] = frozenset()  # matrix names: FP32, FP16, BF16, INT32, INT64, BOOL, ...
    restrictions: str = ""


def _parse(text: str) -> dict[str, OpSupport]:
    ops = {}
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split("|")]
        name, rest = cells[0], cells[1:]
        if rest[0] == "N":
            ops[name] = OpSupport(name, False, restrictions=rest[1] if len(rest) > 1 else "")
        else:
            ops[name] = OpSupport(name, True, frozenset(t.strip() for t in rest[0].split(",")),
                                  rest[1] if len(rest) > 1 else "")
    return ops


OPERATORS: dict[str, OpSupport] = _parse(_MATRIX)

# ONNX element types under the matrix's names. Types TensorRT lists nowhere (INT16, UINT16/32/64,
# STRING, COMPLEX*, FLOAT8 E5M2 and the *FNUZ variants) are absent and so always unsupported.
MATRIX_TYPE = {
    TensorProto.FLOAT: "FP32",
    TensorProto.FLOAT16: "FP16",
    TensorProto.BFLOAT16: "BF16",
    TensorProto.INT32: "INT32",
    TensorProto.INT64: "INT64",
    TensorProto.BOOL: "BOOL",
    TensorProto.UINT8: "UINT8",
    TensorProto.INT8: "INT8",
    TensorProto.INT4: "INT4",
    TensorProto.FLOAT8E4M3FN: "FP8",
    TensorProto.FLOAT4E2M1: "FP4",
    TensorProto.DOUBLE: "DOUBLE",  # cast down to FLOAT by the parser (limited support, a warning)
}
# Matrix note: "UINT8 is only supported as network input or output tensor types."
# Matrix note: INT8/INT4/FP8/FP4 exist only as quantized types (through Q/DQ from a float type).
QUANTIZED_TYPES = frozenset({"INT8", "INT4", "FP8", "FP4"})

# Cast targets the importer converts (CHK: "Unsupported data type for the Cast operator!"):
# the Cast row's types; DOUBLE is cast to FLOAT instead (warned).
CAST_TARGETS = frozenset({"FP32", "FP16", "BF16", "INT32", "INT64", "UINT8", "BOOL"})
# NonZero: the matrix lists FP32, FP16, but the importer's own type check accepts more (IMP).
NONZERO_TYPES = frozenset({"FP32", "FP16", "BF16", "INT32", "INT64", "INT8", "BOOL"})

# TopK: matrix "K input must be less than 3840"; the operator doc says k <= 3840. K < 3840 meets both.
TOPK_K_LIMIT = 3840
# INMSLayer: "The TopK box limit must be less than or equal to {2000 for SM 5.3 and 6.2 devices,
# 5000 otherwise}", per batch item, over all classes.
NMS_BOXES_PER_BATCH_ITEM = 5000
NMS_BOXES_PER_BATCH_ITEM_SMALL_SM = 2000

RESIZE_COORD_MODES = frozenset({"half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn",
                                "asymmetric", "align_corners"})
RESIZE_MODES = frozenset({"nearest", "linear"})  # CHK lets cubic through; the matrix does not list it
RESIZE_NEAREST_MODES = frozenset({"floor", "ceil", "round_prefer_floor", "round_prefer_ceil"})
UPSAMPLE_MODES = frozenset({"nearest", "linear", "bilinear"})
ROIALIGN_COORD_MODES = frozenset({"half_pixel", "output_half_pixel"})  # CHK, opset >= 16
ROIALIGN_MODES = frozenset({"avg", "max"})

REDUCE_OPS = frozenset(n for n in OPERATORS if n.startswith("Reduce"))


def op_support(op_type: str) -> OpSupport | None:
    """The matrix row for ``op_type``, or None when TensorRT 10.15 has no built-in importer for it."""
    return OPERATORS.get(op_type)
