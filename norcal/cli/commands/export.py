"""norcal export / norcal-export: a checkpoint of a registered detector family or any ONNX
detector -> ONNX with NorCal."""

from __future__ import annotations

from pathlib import Path

from norcal.cli.options import (CLASSIFIER_FLAGS, DECODING_FLAGS, add_calibration_options, add_classifier_option,
                                add_decoding_options, checkpoint_help, decoding_option, family_lines,
                                family_names, min_count_line, table_help)
from norcal.core import contract
from norcal.core.errors import NorcalError
from norcal.core.files.fileio import readable_file

HELP = "export a detector to ONNX with the NorCal node baked in (the main job)"
DESCRIPTION = f"""Bake NorCal calibration into a detector's graph.

MODEL is a checkpoint or an ONNX graph of one of these families, tried in this order:
{family_lines()}
A checkpoint is loaded safely (nothing in the file runs) and exported to a batched ONNX graph
(inputs images [B,3,H,W] 0-255 prepared as the model's metadata says, image_sizes [B,2]; outputs
num_detections, boxes, scores, classes, masks); a square-input model's --height = --width changes
its input size. A {family_names(lambda f: f.takes_classifier)} R-CNN without its config needs
--classifier softmax|sigmoid (its weights cannot tell), unless it holds the federated-loss buffer.
Running it on a model that already has NorCal replaces the node (a new gamma); --strip removes it.

NorCal: p(c) = softmax(logits - log a)_c with a_c = N_c^gamma (--factor cdt) or
(1 - gamma^N_c)/(1 - gamma) (--factor ens); the background logit is left alone (sigmoid heads:
p(c) = sigmoid(logit_c - log a_c)).

examples:
  norcal-export model_final.pth --config cfg.yaml --gamma 0.6   -> model_final.norcal.onnx
  norcal-export model_final.pth --classifier sigmoid --gamma 0.6 --verify img1.jpg img2.jpg
  norcal-export best.pt --gamma 0.5 --table train_counts.json    -> best.norcal.onnx (Ultralytics)
  norcal-export detector.onnx --gamma 0.5 --table train_counts.json --background first
  norcal-export model.norcal.onnx --strip -o model.plain.onnx
"""


# parameters of norcal.workflows.export_job named in its errors -> the flags here
FLAGS = {"logits": "--logits", "strip=True": "--strip", "force=True": "--force", "table": "--table",
         "gamma": "--gamma", "verify": "--verify", "skip_unreadable=True": "--skip-unreadable",
         "detections_per_image": "--detections-per-image", "mask_head_rois": "--mask-head-rois",
         "background": "--background", "background_scale": "--background-scale", "opset": "--opset",
         "batch": "--batch", "height": "--height", "width": "--width", **DECODING_FLAGS, **CLASSIFIER_FLAGS}


# what only a calibration uses: --strip refuses them
CALIBRATION_FLAGS = (("--gamma", "gamma"), ("--table", "table"), ("--factor", "factor"),
                     ("--mechanism", "mechanism"), ("--min-count", "min_count"),
                     ("--no-renormalize", "renormalize"), ("--background-scale", "background_scale"),
                     ("--count", "count"), ("--background", "background"), ("--logits", "logits"),
                     ("--inline", "inline"))


def add_arguments(p):
    p.add_argument("model", help=checkpoint_help() + ", or an ONNX detector (.onnx)")
    p.add_argument("-o", "--output", help="output ONNX path (default: MODEL with .norcal.onnx)")
    p.add_argument("--gamma", type=float, help="NorCal gamma (>= 0; ENS: in [0, 1)); 0 = plain softmax")
    p.add_argument("--table", help=table_help("N_c; default: the built-in table matching the class count"))
    add_calibration_options(p)
    p.add_argument("--no-renormalize", dest="renormalize", action="store_false",
                   help="do not renormalise over the classes after scaling")
    # unset (None) until _norcal, so that --strip can tell which calibration flags were given
    p.set_defaults(renormalize=None, factor=None, mechanism=None)  # renormalize unset: the head's own form
    p.add_argument("--background-scale", type=float, default=None,
                   help="multiply the background's exponential by b (default 1)")
    p.add_argument("--count", choices=("image", "instance"), default=None,
                   help="which counts of the table are N_c (default: the table's count type)")
    p.add_argument("--background", choices=("last", "first", "none"), default=None,
                   help="where the background logit is (detectron2: last, torchvision: first; "
                        "none for background-free sigmoid heads); default last")
    p.add_argument("--logits", help="ONNX input only: the classifier logits tensor, if not found automatically")
    p.add_argument("--inline", action="store_true", help="write plain ops instead of the NorCal function node")
    p.add_argument("--strip", action="store_true", help="remove the NorCal node instead of adding one")
    g = p.add_argument_group(f"checkpoints ({family_names(lambda f: f.reads_checkpoints)})")
    g.add_argument("--config", help="detectron2 only: its config yaml (_BASE_ chains followed); default: "
                                    "inferred from the weights with detectron2's LVIS test settings")
    add_classifier_option(g)
    g.add_argument("--batch", type=int, help="fix the batch size (default dynamic)")
    g.add_argument("--height", type=int, help="fix the padded input height (default dynamic; Ultralytics: "
                                              "the letterbox square, = --width, default its imgsz)")
    g.add_argument("--width", type=int, help="fix the padded input width (default dynamic)")
    g.add_argument("--opset", type=int, help="ONNX opset (default 17)")
    g.add_argument("--detections-per-image", type=int, metavar="K",
                   help="K, the detections per image the outputs hold (default: the config's "
                        "TEST.DETECTIONS_PER_IMAGE; Ultralytics: 300)")
    g.add_argument("--mask-head-rois", choices=("valid", "static"), default=None,
                   help="detectron2 only: run the mask head on the detections only and pool each FPN level's own "
                        "proposals (valid, default: data-dependent shapes), or the mask head on all "
                        "K slots and every proposal at every level (static: fixed shapes, e.g. for "
                        "TensorRT profiles where data-dependent shapes cost more)")
    add_decoding_options(p)
    g.add_argument("--verify", nargs="+", metavar="IMAGE",
                   help="run ONNX Runtime against the PyTorch model on these images and print differences")
    g.add_argument("--skip-unreadable", action="store_true",
                   help="--verify: leave out files that cannot be read as images (counted) instead of stopping")
    p.add_argument("--triton-repo", metavar="DIR", help="also write a Triton model repository here "
                                                         "(DIR/<name>/config.pbtxt + 1/model.onnx)")
    p.add_argument("--force", action="store_true", help="replace an existing Triton model folder")


def default_output(model: Path) -> Path:
    from norcal.export.families import checkpoint_suffixes

    name = model.name
    for suffix in (".onnx", *checkpoint_suffixes()):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return model.with_name(name + ".norcal.onnx")


def run(args) -> int:
    from norcal.cli.options import check_outputs

    src = Path(args.model)
    readable_file(src)
    out = Path(args.output) if args.output else default_output(src)
    check_outputs([src, args.config, args.table, *(args.verify or ())],
                  files={"-o": out}, folders={"--triton-repo": args.triton_repo})
    if args.strip:
        # each is None unless given (--no-renormalize gives False); --inline is False unless given
        given = [flag for flag, dest in CALIBRATION_FLAGS
                 if (getattr(args, dest) if dest == "inline" else getattr(args, dest) is not None)]
        if given:
            raise NorcalError(f"--strip removes NorCal; it takes no {', '.join(given)}")
    from norcal.export.families import checkpoint_suffixes

    is_checkpoint = src.suffix.lower() in checkpoint_suffixes()
    if not is_checkpoint and src.suffix.lower() != ".onnx":
        from norcal.core.files.onnx_io import not_onnx_checkpoint

        foreign = not_onnx_checkpoint(src)  # read as ONNX, it would fail on its bytes or on --config
        if foreign is not None:
            raise foreign
    if not args.strip and args.gamma is None and not (is_checkpoint and args.config):
        # a checkpoint's config may carry the NorCal authors' TEST.CALIBRATION settings
        raise NorcalError("--gamma is required (0 gives the plain softmax)")
    if not is_checkpoint:
        given = [f"--{k.replace('_', '-')}" for k in ("config", "classifier", "verify", "batch", "height", "width",
                                                      "opset", "detections_per_image", "mask_head_rois")
                 if getattr(args, k) is not None] + (["--skip-unreadable"] if args.skip_unreadable else [])
        if given:
            raise NorcalError(f"{', '.join(given)} apply to checkpoints, not ONNX input")
    if args.skip_unreadable and not args.verify:
        raise NorcalError("--skip-unreadable applies to --verify's images; no --verify given")
    if is_checkpoint:
        result = _export_checkpoint(src, out, args)
    else:
        from norcal.workflows.export_job import export_onnx_file

        result = export_onnx_file(src, out, None if args.strip else _norcal(args), strip=args.strip,
                                  triton_repo=args.triton_repo, force=args.force, decoding=decoding_option(args))
    print_summary(result)
    if args.min_count is not None:
        meta = {p.key: p.value for p in result.model.metadata_props}
        print(min_count_line(args.min_count, int(meta[contract.MIN_COUNT_CLAMPED]),
                             int(meta[contract.NUM_CLASSES])))
    return 0


def _norcal(args):
    from norcal.workflows.export_job import NorCal

    return NorCal(gamma=args.gamma, table=args.table, factor=args.factor or "cdt",
                  mechanism=args.mechanism or "exp", renormalize=args.renormalize,
                  background_scale=1.0 if args.background_scale is None else args.background_scale,
                  count=args.count, background=args.background, logits=args.logits,
                  inline=args.inline, min_count=args.min_count)


def _export_checkpoint(src: Path, out: Path, args):
    from norcal.cli.terminal import SafeConsole as Console

    from norcal.workflows.export_job import CheckpointExport, export_checkpoint

    if args.strip:
        raise NorcalError("--strip applies to ONNX models; a checkpoint export has no node to strip")
    options = CheckpointExport(config=args.config, batch=args.batch, height=args.height,
                               width=args.width, opset=CheckpointExport.opset if args.opset is None else args.opset,
                               detections_per_image=args.detections_per_image,
                               mask_head_rois=args.mask_head_rois, decoding=decoding_option(args),
                               classifier=args.classifier)
    status = Console(stderr=True).status("")

    def step(name: str) -> None:
        if name == "verifying":
            status.stop()  # the verify report prints its own table
        else:
            status.update(name)
            status.start()

    try:
        return export_checkpoint(src, out, _norcal(args), options, verify=args.verify or (),
                                 triton_repo=args.triton_repo, force=args.force, progress=step,
                                 skip_unreadable=args.skip_unreadable)
    finally:
        status.stop()


def print_summary(result) -> None:
    """The export summary: a table of what was written, then the notes (verify, Triton)."""
    from norcal.cli.terminal import SafeConsole as Console
    from rich.markup import escape
    from rich.table import Table

    from norcal.core.files.onnx_io import describe_io
    from norcal.core.files.outputs import current_path
    from norcal.export.trt_check.support import TENSORRT_VERSION

    console = Console(soft_wrap=True)
    meta = result.norcal
    t = Table(title=f"exported {result.output}", show_header=False)
    t.add_row("source", str(result.source))
    if result.ingest:
        t.add_row("ingest", escape(result.ingest))
    for label, value in result.description:  # the loaded detector's own rows (Detector.describe)
        t.add_row(escape(label), escape(value))
    report = result.tensorrt
    verdict = "compatible" if report.compatible else f"NOT compatible ({len(report.errors)} errors)"
    t.add_row(f"TensorRT {TENSORRT_VERSION} parser",
              f"{verdict}, {len(report.warnings)} warnings with the default profile "
              f"(details: norcal check {result.output})")
    if meta:
        t.add_row("classes", meta.get(contract.NUM_CLASSES, "?"))
        t.add_row("table", f"{meta.get(contract.TABLE)} (sha256 {meta.get(contract.TABLE_SHA256, '')[:16]}…)")
        t.add_row("NorCal", f"gamma {meta.get(contract.GAMMA)}, factor {meta.get(contract.FACTOR)}, "
                            f"mechanism {meta.get(contract.MECHANISM)}, renormalize "
                            f"{meta.get(contract.RENORMALIZE)}, background {meta.get(contract.BACKGROUND)}")
        t.add_row("computes", escape(_computed_as(meta)))
        node = ("inlined ops" if meta.get(contract.INLINE) == "true"
                else f"{contract.NODE_DOMAIN}::{contract.NODE_OP_TYPE}")
        t.add_row("node", escape(f"{node} on {', '.join(result.placement)}"))
    else:
        t.add_row("NorCal", "none (plain classifier)")
    for kind, name, dtype, shape in describe_io(result.model):
        t.add_row(kind, escape(f"{name}: {dtype} {shape}"))
    t.add_row("file size", f"{current_path(result.output).stat().st_size / 2**20:.1f} MiB")
    t.add_row("time", f"{result.seconds:.1f} s")
    console.print(t)
    if result.verification is not None:
        from norcal.cli.parity_tables import verify_text

        console.print(escape(verify_text(result.verification)))
    if result.calibration_from_config:
        console.print(escape(f"NorCal settings taken from the config's TEST.CALIBRATION keys (no --gamma given): "
                             f"{result.calibration_from_config}"))
    if result.triton_dir is not None:
        console.print(escape(f"Triton model repository written: {result.triton_dir}"))


def _computed_as(meta: dict[str, str]) -> str:
    """What the written node computes, from the variant its metadata records."""
    from norcal.export.graph.norcal_node import computed_as

    try:
        return computed_as(meta.get(contract.MECHANISM, ""), meta.get(contract.RENORMALIZE) == "true",
                           meta.get(contract.ACTIVATION, ""))
    except NorcalError:
        return "?"
