"""norcal build: a TensorRT engine from an exported detector (or the trtexec line for one)."""

from __future__ import annotations

from pathlib import Path

from norcal.core.errors import NorcalError
from norcal.core.files.fileio import readable_file
from norcal.core.profiles import DEFAULT_BATCH
from norcal.core.tensorrt_targets import LIBRARIES, RTX_CAPABILITIES, RTX_DEFAULT_CAPABILITIES

HELP = "build a TensorRT engine (fp32/fp16/int8) from an exported ONNX detector"
DESCRIPTION = f"""Build a TensorRT 10 engine from an exported detector with one optimization profile
over its inputs images [B,3,H,W] and image_sizes [B,2]. The model's NorCal metadata goes into
a sidecar ENGINE.json that the TensorRT runner reads.

It always prints the equivalent trtexec command first, so a machine with TensorRT but no
Python package (a Jetson) can build the same engine with trtexec alone; --trtexec-only
prints it and writes just the sidecar, for use next to the engine trtexec makes.

  norcal build model.onnx -o model.engine
  norcal build model.onnx --fp16 --batch 1:4:8 --shapes 320x320:800x1088:1344x1344 -o model.engine
  norcal build model.onnx --shape 800x1088 --workspace 4 --timing-cache trt.cache -o model.engine
  norcal quantize model.onnx --images train/ && norcal build model.int8.onnx --int8 -o model.engine

--int8 takes the Q/DQ model norcal quantize writes (explicit quantization, as TensorRT 10
wants: its implicit calibrator is deprecated) and refuses a model without QuantizeLinear nodes.

Defaults: batch {DEFAULT_BATCH[0]}:{DEFAULT_BATCH[1]}:{DEFAULT_BATCH[2]}; H and W from the model's resize metadata
(short edge 800, long edge 1333, padded to 32 when absent: 32x32 to 1344x1344, opt 800x1088).
The model is checked first (norcal check) unless --skip-check.

--target rtx builds with NVIDIA's TensorRT for RTX (pip install 'norcal-deploy[tensorrt-rtx]')
ahead of time, on any machine, CPU-only included, for RTX-class GPUs (compute capability
8.0, 8.6, 8.9, 12.x; 7.5 with --compute-capability 7.5); the engine compiles for the device on
its first run. It does not run on Hopper (H100/H200). A graph with a data-dependent layer or
a plugin (NonZero, NonMaxSuppression, RoiAlign) is refused, naming the nodes.

  norcal build model.onnx --target rtx -o model.rtx.engine
"""

# parameters of the engine build named in its errors -> the flags here
FLAGS = {"check=False": "--skip-check", "target": "--target", "capabilities": "--compute-capability", "workspace_gb": "--workspace", "fp16": "--fp16",
         "batch": "--batch", "int8": "--int8", "hw": "--shape/--shapes", "form='tensorrt'": "norcal quantize --form tensorrt"}


def add_arguments(p):
    p.add_argument("model", help="exported ONNX detector")
    p.add_argument("-o", "--output", required=True, help="engine file to write (e.g. model.engine)")
    p.add_argument("--fp16", action="store_true", help="let TensorRT use FP16 kernels (I/O stays as in the ONNX)")
    p.add_argument("--int8", action="store_true",
                   help="int8 engine from an explicitly quantized (Q/DQ) model written by norcal quantize "
                        "(no calibrator: the ranges are in the model)")
    p.add_argument("--batch", default=None, metavar="MIN:OPT:MAX",
                   help=f"batch sizes of the profile (default {':'.join(map(str, DEFAULT_BATCH))}; N means N:N:N)")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--shape", metavar="HxW", help="one fixed padded image size, e.g. 800x1088")
    shape.add_argument("--shapes", metavar="MINHxMINW:OPTHxOPTW:MAXHxMAXW",
                       help="padded image size range, e.g. 320x320:800x1088:1344x1344")
    p.add_argument("--workspace", type=float, metavar="GB",
                   help="builder workspace limit in GiB (default: TensorRT's, the device's memory)")
    p.add_argument("--timing-cache", metavar="FILE",
                   help="reuse and update this timing cache (faster rebuilds on the same GPU)")
    p.add_argument("--trtexec-only", action="store_true",
                   help="print the trtexec command and write only the sidecar; no TensorRT needed")
    p.add_argument("--skip-check", action="store_true", help="do not run the static TensorRT check first")
    p.add_argument("--verbose", action="store_true", help="print TensorRT's info messages too")
    p.add_argument("--target", choices=list(LIBRARIES), default="tensorrt",
                   help="tensorrt: TensorRT 10/11, an engine for this machine's GPU; rtx: TensorRT for RTX, "
                        "built ahead of time on any machine (no GPU needed) for RTX-class GPUs")
    p.add_argument("--compute-capability", action="append", default=None, metavar="X.Y",
                   choices=list(RTX_CAPABILITIES),
                   help=f"with --target rtx, a compute capability to build for (repeat; default "
                        f"{' '.join(RTX_DEFAULT_CAPABILITIES)}; 7.5 on request; no Hopper H100/H200)")


def run(args) -> int:
    from norcal.cli.options import check_outputs, parse_hw, parse_hw_range, parse_range
    from norcal.runtime.tensorrt_build import (BuildOptions, build_engine, sidecar_path, workspace_mib,
                                               write_trtexec_sidecar)
    from norcal.workflows.build import prepare

    readable_file(args.model)
    # with --trtexec-only, trtexec writes the engine: its location is checked all the same
    check_outputs([args.model], files={"-o": args.output, "sidecar": sidecar_path(args.output),
                                       "--timing-cache": args.timing_cache})
    hw = None
    if args.shape:
        fixed = parse_hw(args.shape)
        hw = (fixed, fixed, fixed)
    elif args.shapes:
        hw = parse_hw_range(args.shapes)
    options = BuildOptions(
        onnx_path=Path(args.model), engine_path=Path(args.output), fp16=args.fp16, int8=args.int8,
        batch=parse_range(args.batch) if args.batch else None, hw=hw,
        workspace_gb=args.workspace, timing_cache=Path(args.timing_cache) if args.timing_cache else None,
        target=args.target,
        capabilities=tuple(args.compute_capability) if args.compute_capability else None,
    )
    if options.workspace_gb is not None and not options.workspace_gb > 0:
        raise NorcalError(f"--workspace {args.workspace}: must be a positive number of GiB")
    if options.workspace_gb is not None:
        workspace_mib(options.workspace_gb)  # its range, before any work
    if args.trtexec_only and LIBRARIES[args.target].ahead_of_time:
        raise NorcalError("--trtexec-only builds for TensorRT 10/11: trtexec does not build TensorRT for RTX "
                          "engines; drop --target rtx or --trtexec-only")
    model, profiles, cmd = prepare(options, check=not args.skip_check)
    if not LIBRARIES[args.target].ahead_of_time:
        print("equivalent trtexec command:")
        print(f"  {cmd}", flush=True)
    if args.trtexec_only:
        write_trtexec_sidecar(options, model, profiles, cmd)
        print(f"wrote {sidecar_path(options.engine_path)} (metadata for the engine trtexec will write)")
        return 0
    content = build_engine(options, model, profiles, cmd, verbose=args.verbose, on_message=print)
    built_for = (f", for compute capability {' '.join(content['compute_capabilities'])}"
                 if content["compute_capabilities"] else "")
    print(f"wrote {options.engine_path} ({content['precision']}, {content['library']} "
          f"{content['tensorrt_version']}{built_for}) and {sidecar_path(options.engine_path)}")
    return 0
