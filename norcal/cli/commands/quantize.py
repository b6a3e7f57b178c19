"""norcal quantize: an int8 (Q/DQ, calibrated) or fp16 variant of an exported detector."""

from __future__ import annotations

from pathlib import Path

from norcal.core.errors import NorcalError
from norcal.core.files.fileio import readable_file

HELP = "write an int8 (explicit Q/DQ, calibrated on images) or fp16 variant of an exported detector"
DESCRIPTION = """Write a lower-precision variant of a detector exported by norcal export.

int8: QuantizeLinear/DequantizeLinear pairs on the inputs of the backbone's, FPN's, RPN's and
box head's convolutions and fully connected layers (a transformer's too; attention's products of
two activations, which have no weights, stay fp32), the way TensorRT 10 builds explicitly
quantized engines (signed int8, zero point 0, weights per output channel, activations per
tensor): `norcal build --int8` takes the result, ONNX Runtime runs it on CPU. Activation
ranges come from the images in --images, read and prepared as the runners prepare them (the
model's resize metadata); use images like the ones the model will see, not the ones you
evaluate on. fp16: the same layers in float16, inputs and outputs stay float32.

--form ort writes int8 for ONNX Runtime's CPU provider instead: Q/DQ on the layers' outputs
too, uint8 activations, int8 weights per channel, int32 biases, which ONNX Runtime fuses into
QLinearConv / QGemm int8 kernels (the tensorrt form runs at fp32's speed there). TensorRT does
not build it. --int8-mask-head also quantizes the mask head's convolutions: they feed the
masks only (boxes, scores and classes are the same as without), and on a Mask R-CNN with many
detections they are most of the CPU time.

Both keep in fp32 the layers that compute the classifier logits (an R-CNN's box predictor,
a YOLO head's last class convolutions, an RT-DETR's last decoder class head) and everything
after them: the NorCal node, box decoding, NMS, TopK and the mask branch. Quantization is done with ONNX Runtime's
quantization tools (nvidia-modelopt cannot keep the NorCal function; see
norcal/export/quantize.py). The output's metadata records the precision, the method and
the number of calibration images.

  norcal quantize model.norcal.onnx --images train_images/ --num-images 256  -> model.norcal.int8.onnx
  norcal quantize model.norcal.onnx --images train_images/ --form ort  -> model.norcal.int8-ort.onnx
  norcal quantize model.norcal.onnx --precision fp16 -o model.fp16.onnx
"""

# parameters of norcal.workflows.quantize named in its errors -> the flags here
FLAGS = {"images": "--images", "num_images": "--num-images", "batch_size": "--batch",
         "precision": "--precision", "method": "--method", "output": "-o",
         "skip_unreadable=True": "--skip-unreadable", "form": "--form", "mask_head=True": "--int8-mask-head"}


def add_arguments(p):
    p.add_argument("model", help="ONNX detector exported by norcal export (fp32)")
    p.add_argument("-o", "--output", help="output ONNX path (default: MODEL with .int8.onnx or .fp16.onnx)")
    p.add_argument("--precision", choices=("int8", "fp16"), default="int8", help="default int8")
    p.add_argument("--images", metavar="DIR", help="int8: folder of calibration images (searched recursively)")
    p.add_argument("--num-images", type=int, metavar="N",
                   help="int8: calibrate on the first N images in name order (default: all)")
    p.add_argument("--batch", type=int, default=1, help="int8: images per calibration batch (default 1)")
    p.add_argument("--method", choices=("minmax", "entropy", "percentile"), default="minmax",
                   help="int8: how activation ranges are taken from calibration (default minmax)")
    p.add_argument("--form", choices=("tensorrt", "ort"), default="tensorrt",
                   help="int8: tensorrt (Q/DQ on layer inputs, for norcal build; default) or ort (int8 kernels "
                        "in ONNX Runtime's CPU provider)")
    p.add_argument("--int8-mask-head", action="store_true",
                   help="int8: quantize the mask head's convolutions too (they feed the masks only)")
    p.add_argument("--skip-unreadable", action="store_true",
                   help="leave out calibration files that cannot be read as images (counted) instead of stopping")


def run(args) -> int:
    from norcal.cli.terminal import SafeConsole as Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from norcal.cli.options import check_outputs, progress_bars
    from norcal.workflows.quantize import QuantizeOptions, default_output, quantize_model

    src = Path(args.model)
    readable_file(src)
    if args.precision == "fp16" and args.images:
        raise NorcalError("--images calibrates int8; fp16 needs no images (leave --images out)")
    if args.precision == "fp16" and (args.form != "tensorrt" or args.int8_mask_head):
        raise NorcalError("--form and --int8-mask-head choose how int8 is written; fp16 takes neither")
    if args.num_images is not None and args.num_images < 1:
        raise NorcalError(f"--num-images must be >= 1, got {args.num_images}")
    if args.batch < 1:
        raise NorcalError(f"--batch must be >= 1, got {args.batch}")
    output = Path(args.output) if args.output else default_output(src, args.precision, args.form)
    check_outputs([src, args.images], files={"-o": output})
    options = QuantizeOptions(model=src, output=output, precision=args.precision,
                              images=Path(args.images) if args.images else None,
                              num_images=args.num_images, batch_size=args.batch, method=args.method,
                              skip_unreadable=args.skip_unreadable, form=args.form,
                              mask_head=args.int8_mask_head)
    console = Console(soft_wrap=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        result = quantize_model(options, progress=progress_bars(progress))
    for path, why in result.skipped:
        console.print(f"skipped {path}: {why}")
    how = (f"{result.form} form, {result.qdq_nodes} Q/DQ nodes, calibrated on {result.calibration_images} images"
           if result.precision == "int8" else "classifier layers, NorCal, decoding and NMS in fp32")
    console.print(f"wrote {result.output} ({result.precision}: {how}) in {result.seconds:.1f} s")
    return 0
