"""norcal export / norcal-export: a detectron2 checkpoint or any ONNX detector -> ONNX with NorCal."""

from __future__ import annotations

from pathlib import Path

from norcal.cli.commands._options import add_calibration_options
from norcal.core.errors import NorcalError

HELP = "export a detector to ONNX with the NorCal node baked in (the main job)"
DESCRIPTION = """Bake NorCal calibration into a detector's graph.

MODEL is either
  * a detectron2 checkpoint (.pth, or a model-zoo .pkl) [+ --config config.yaml]: it is loaded
    safely, rebuilt as an export-friendly Mask/Faster R-CNN and exported to a batched ONNX graph
    (inputs images [B,3,H,W] BGR 0-255 resized+padded, image_sizes [B,2]; outputs num_detections,
    boxes, scores, classes, masks), or
  * an ONNX detector (any framework): the box classifier (a Softmax over the last axis or a
    Sigmoid fed by a Gemm/MatMul) is found and replaced by the NorCal node.
Running it on a model that already has NorCal replaces the node (a new gamma); --strip removes it.

NorCal: p(c) = softmax(logits - log a)_c with a_c = N_c^gamma (--factor cdt) or
(1 - gamma^N_c)/(1 - gamma) (--factor ens); the background logit is left alone.

examples:
  norcal-export model_final.pth --gamma 0.6                     -> model_final.norcal.onnx
  norcal-export model_final.pth --config cfg.yaml --gamma 0.6 --verify img1.jpg img2.jpg
  norcal-export detector.onnx --gamma 0.5 --table train_counts.json --background first
  norcal-export model.norcal.onnx --strip -o model.plain.onnx
"""

CHECKPOINT_SUFFIXES = (".pth", ".pt", ".pkl")


def add_arguments(p):
    p.add_argument("model", help="detectron2 checkpoint (.pth/.pkl) or ONNX detector (.onnx)")
    p.add_argument("-o", "--output", help="output ONNX path (default: MODEL with .norcal.onnx)")
    p.add_argument("--gamma", type=float, help="NorCal gamma (>= 0; ENS: in [0, 1)); 0 = plain softmax")
    p.add_argument("--table", help="calibration table: built-in name (lvis_v1, lvis_v0_5), a table JSON, "
                                   "or the training annotation file itself (default: the built-in "
                                   "table matching the class count)")
    add_calibration_options(p)
    p.add_argument("--no-renormalize", dest="renormalize", action="store_false",
                   help="do not renormalise over the classes after scaling")
    p.add_argument("--background-scale", type=float, default=1.0,
                   help="multiply the background's exponential by b (default 1)")
    p.add_argument("--count", choices=("image", "instance"), default=None,
                   help="which counts of the table are N_c (default: the table's count type)")
    p.add_argument("--background", choices=("last", "first", "none"), default=None,
                   help="where the background logit is (detectron2: last, torchvision: first; "
                        "none for background-free sigmoid heads); default last")
    p.add_argument("--logits", help="ONNX input only: the classifier logits tensor, if not found automatically")
    p.add_argument("--inline", action="store_true", help="write plain ops instead of the NorCal function node")
    p.add_argument("--strip", action="store_true", help="remove the NorCal node instead of adding one")
    g = p.add_argument_group("detectron2 checkpoints")
    g.add_argument("--config", help="detectron2 config yaml (_BASE_ chains followed); default: inferred "
                                    "from the weights with detectron2's LVIS test settings")
    g.add_argument("--batch", type=int, help="fix the batch size (default dynamic)")
    g.add_argument("--height", type=int, help="fix the padded input height (default dynamic)")
    g.add_argument("--width", type=int, help="fix the padded input width (default dynamic)")
    g.add_argument("--opset", type=int, help="ONNX opset (default 17)")
    g.add_argument("--verify", nargs="+", metavar="IMAGE",
                   help="run ONNX Runtime against the PyTorch model on these images and print differences")
    p.add_argument("--triton-repo", metavar="DIR", help="also write a Triton model repository here "
                                                         "(DIR/<name>/config.pbtxt + 1/model.onnx)")
    p.add_argument("--force", action="store_true", help="replace an existing Triton model folder")


def default_output(model: Path) -> Path:
    name = model.name
    for suffix in (".onnx", *CHECKPOINT_SUFFIXES):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return model.with_name(name + ".norcal.onnx")


def run(args) -> int:
    from norcal.workflows.export_job import export_checkpoint, export_onnx_file, triton_name
    from norcal.core.fileio import same_file

    src = Path(args.model)
    if not src.is_file():
        raise NorcalError(f"{src}: no such file")
    out = Path(args.output) if args.output else default_output(src)
    if same_file(src, out):
        raise NorcalError(f"output {out} is the input file; choose another -o (inputs are never modified)")
    if args.strip and args.gamma is not None:
        raise NorcalError("--strip removes NorCal; it takes no --gamma")
    if not args.strip and args.gamma is None:
        raise NorcalError("--gamma is required (0 gives the plain softmax)")
    is_checkpoint = src.suffix.lower() in CHECKPOINT_SUFFIXES
    if not is_checkpoint:
        given = [f"--{k}" for k in ("config", "verify", "batch", "height", "width", "opset")
                 if getattr(args, k) is not None]
        if given:
            raise NorcalError(f"{', '.join(given)} apply to detectron2 checkpoints, not ONNX input")
    if args.triton_repo:
        from norcal.runtime.triton import check_target

        check_target(args.triton_repo, triton_name(out), args.force)  # before any work is done
    if is_checkpoint:
        result = export_checkpoint(src, out, args)
    else:
        result = export_onnx_file(src, out, args)
    if result.verification is not None:  # the --verify report comes first among the notes
        from norcal.cli.parity_tables import verify_text

        result.notes.insert(0, verify_text(result.verification))
    result.print_summary()
    return 0
