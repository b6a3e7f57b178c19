"""norcal check: will TensorRT's ONNX parser build this model? (No TensorRT needed.)"""

from __future__ import annotations

from norcal.core.tensorrt_targets import LIBRARIES
from norcal.export.trt_check.support import OPSET_MAX, OPSET_MIN, TENSORRT_VERSION

HELP = f"check an ONNX model against the TensorRT {TENSORRT_VERSION} ONNX parser (no TensorRT needed)"
DESCRIPTION = f"""Check every operator, data type and attribute of an ONNX model against the
TensorRT {TENSORRT_VERSION} ONNX parser's support matrix, without TensorRT installed.

Model-local functions (like the NorCal node) are expanded and their bodies checked. Also
checked: opset {OPSET_MIN}..{OPSET_MAX}; TopK K < 3840 and sorted=1; RoiAlign's sampling_ratio written
(TensorRT reads a missing one as 1, ONNX as 0); Resize modes; Reduce* axes initializers;
Squeeze/Unsqueeze axes constant; ScatterND reduction none; Cast targets; UINT8 only at the
network's inputs and outputs; DOUBLE (warned: cast to FLOAT); NonMaxSuppression's limit of
5000 candidates per batch item (warned). Every dynamic input dimension must be covered by an
optimization profile: the detector inputs images [B,3,H,W] and image_sizes [B,2] get a default
one (stated in the output); other inputs need --profile (once per input). Inputs that share a
named dim (B above) must agree on its range: a default profile takes the range given for the
other input; two given ranges that differ are refused.

  norcal check model.onnx
  norcal check model.onnx --profile images:1x3x320x320:2x3x800x1088:4x3x1344x1344 \\
                          --profile image_sizes:1x2:2x2:4x2

Where NVIDIA's TensorRT for RTX is installed (pip install 'norcal-deploy[tensorrt-rtx]', no
GPU needed), its own ONNX parser runs on the model too and its verdict is printed beside the
table's: the first node it refuses, and whether TensorRT for RTX's listed gaps (NonZero,
NonMaxSuppression, RoiAlign: data-dependent layers and plugins it lacks, which TensorRT 10/11
build) explain it; a refusal they do not explain is an error. Ops TensorRT imports as plugins
(RoiAlign -> ROIAlign_TRT, from libnvinfer_plugin) are listed with what they need.

Exit status: 0 compatible (warnings allowed), 1 not compatible, 2 bad input.
"""

# parameters named in the checker's errors -> the flags here
FLAGS = {"profile": "--profile"}


def add_arguments(p):
    p.add_argument("model", help="ONNX model to check")
    p.add_argument("--profile", action="append", default=[], metavar="INPUT:MIN:OPT:MAX",
                   help="optimization profile for one input, shapes as dims joined by 'x' "
                        "(repeat per input; overrides the default profile for that input)")
    p.add_argument("--quiet", action="store_true", help="print only the verdict and the errors")


def run(args) -> int:
    from norcal.cli.terminal import SafeConsole as Console
    from rich.table import Table

    from norcal.cli.options import parse_profile
    from norcal.export.trt_check import check_model

    profiles = [parse_profile(t) for t in args.profile]
    report = check_model(args.model, profiles)
    console = Console(soft_wrap=True)
    shown = report.errors if args.quiet else report.findings
    if shown:
        table = Table("severity", "node", "op_type", "reason", title="TensorRT findings")
        for f in shown:
            style = "red" if f.severity == "error" else "yellow"
            table.add_row(f"[{style}]{f.severity}[/{style}]", f.node, f.op_type, f.reason)
        console.print(table)
    if report.plugins and not args.quiet:
        pl = Table("op_type", "nodes", "TensorRT plugin", "library", "since", title="imported as plugins")
        for entry in report.plugins:
            pl.add_row(entry["op_type"], str(len(entry["nodes"])), entry["plugin"], entry["library"],
                       f"TensorRT {entry['since']}")
        console.print(pl)
        console.print("note: the plugin library must be registered before parsing and before deserializing "
                      "(norcal build and the runners do; a C++ host calls initLibNvInferPlugins and links "
                      "nvinfer_plugin; trtexec loads it itself)")
    if not args.quiet:
        if report.profiles:
            pt = Table("input", "min", "opt", "max", "source", title="optimization profile")
            for p in report.profiles.values():
                pt.add_row(p.input, "x".join(map(str, p.min)), "x".join(map(str, p.opt)),
                           "x".join(map(str, p.max)), p.source)
            console.print(pt)
        for note in report.notes:
            console.print(f"note: {note}")
    summary = (f"{args.model}: opset {report.opset}, {report.num_nodes} nodes "
               f"({len(report.op_types)} op types), {len(report.errors)} errors, "
               f"{len(report.warnings)} warnings")
    console.print(summary)
    if report.nvidia is not None:
        console.print(report.nvidia.summary())
    else:
        console.print(f"NVIDIA's parser: not installed, so only our table judged it "
                      f"({LIBRARIES['rtx'].install} runs NVIDIA's on any machine)")
    if report.compatible:
        console.print(f"[green]compatible[/green] with the TensorRT {report.tensorrt_version} ONNX parser")
        return 0
    console.print(f"[red]NOT compatible[/red] with the TensorRT {report.tensorrt_version} ONNX parser")
    return 1
