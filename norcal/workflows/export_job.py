"""The export job end to end: load, export (checkpoints), calibrate, check, write, summarise."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from norcal.core import contract as C
from norcal.core.errors import NorcalError
from norcal.export.calibrate_onnx import calibrate_onnx
from norcal.core.onnx_io import describe_io, load_onnx, save_onnx
from norcal.export.surgery import has_norcal, norcal_metadata, strip_norcal
from norcal.export.trt_support import TENSORRT_VERSION


@dataclass
class NorCalOptions:
    """The calibration the user asked for (None gamma with strip=True removes NorCal)."""

    gamma: float | None
    table: str | None = None
    factor: str = "cdt"
    mechanism: str = "exp"
    renormalize: bool = True
    background_scale: float = 1.0
    count: str | None = None
    background: str | None = None
    logits: str | None = None
    inline: bool = False
    strip: bool = False

    @classmethod
    def from_args(cls, args) -> "NorCalOptions":
        return cls(**{k: getattr(args, k) for k in cls.__dataclass_fields__})

    def apply(self, model: onnx.ModelProto) -> onnx.ModelProto:
        if self.strip:
            return strip_norcal(model)
        return calibrate_onnx(model, self.gamma, self.table, factor=self.factor,
                              mechanism=self.mechanism, renormalize=self.renormalize,
                              background=self.background or "last",
                              background_scale=self.background_scale, count_type=self.count,
                              logits=self.logits, inline=self.inline)


@dataclass
class ExportResult:
    source: Path
    output: Path
    model: onnx.ModelProto
    seconds: float
    extra_rows: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def print_summary(self) -> None:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        console = Console(soft_wrap=True)
        meta = norcal_metadata(self.model) if has_norcal(self.model) else {}
        t = Table(title=f"exported {self.output}", show_header=False)
        t.add_row("source", str(self.source))
        for k, v in self.extra_rows:
            t.add_row(k, v)
        if meta:
            t.add_row("classes", meta.get(C.NUM_CLASSES, "?"))
            t.add_row("table", f"{meta.get(C.TABLE)} (sha256 {meta.get(C.TABLE_SHA256, '')[:16]}…)")
            t.add_row("NorCal", f"gamma {meta.get(C.GAMMA)}, factor {meta.get(C.FACTOR)}, "
                                f"mechanism {meta.get(C.MECHANISM)}, renormalize "
                                f"{meta.get(C.RENORMALIZE)}, background {meta.get(C.BACKGROUND)}")
            node = "inlined ops" if meta.get(C.INLINE) == "true" else f"{C.NODE_DOMAIN}::{C.NODE_OP_TYPE}"
            t.add_row("node", f"{node} on {meta.get(C.LOGITS)}")
        else:
            t.add_row("NorCal", "none (plain classifier)")
        for kind, name, dtype, shape in describe_io(self.model):
            t.add_row(kind, escape(f"{name}: {dtype} {shape}"))
        t.add_row("file size", f"{self.output.stat().st_size / 2**20:.1f} MiB")
        t.add_row("time", f"{self.seconds:.1f} s")
        console.print(t)
        for n in self.notes:
            console.print(escape(n))


TRT_ROW = f"TensorRT {TENSORRT_VERSION} parser"


def _finish(model: onnx.ModelProto, out: Path) -> str:
    """Check, write, and return the TensorRT-parser verdict for the summary."""
    from norcal.export.trt_check import check_model

    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as e:  # a bug of ours, not the user's: keep the trace
        raise RuntimeError(f"the calibrated model fails the ONNX checker: {e}") from e
    save_onnx(model, out)
    report = check_model(model)
    verdict = "compatible" if report.compatible else f"NOT compatible ({len(report.errors)} errors)"
    return (f"{verdict}, {len(report.warnings)} warnings with the default profile "
            f"(details: norcal check {out})")


def export_onnx_file(src: Path, out: Path, args) -> ExportResult:
    """ONNX in, ONNX out: surgery only."""
    t0 = time.perf_counter()
    opts = NorCalOptions.from_args(args)
    model = opts.apply(load_onnx(src))
    trt = _finish(model, out)
    result = ExportResult(src, out, model, time.perf_counter() - t0, [(TRT_ROW, trt)])
    _triton(result, args)
    return result


def export_checkpoint(src: Path, out: Path, args) -> ExportResult:
    """A detectron2 checkpoint -> batched ONNX with NorCal (see norcal.export.onnx_export)."""
    from rich.console import Console

    from norcal.export.detector import load_detector, export_detector

    console = Console(stderr=True)
    t0 = time.perf_counter()
    opts = NorCalOptions.from_args(args)
    if opts.strip:
        raise NorcalError("--strip applies to ONNX models; a checkpoint export has no node to strip")
    if opts.logits:
        raise NorcalError("--logits applies to ONNX input; a checkpoint export knows its classifier")
    with console.status("loading checkpoint"):
        spec, model = load_detector(src, args.config)
    with console.status("exporting to ONNX"):
        graph = export_detector(model, spec, batch=args.batch, height=args.height,
                                width=args.width, opset=args.opset or 17)
    with console.status("inserting the NorCal node"):
        graph = opts.apply(graph)
    trt = _finish(graph, out)
    rows = [("architecture", f"{spec.meta_architecture} R{spec.depth}-FPN, {spec.num_classes} classes, "
                             f"{'mask' if spec.mask_on else 'box'} head"),
            ("test settings", f"short edge {spec.min_size_test}, max {spec.max_size_test}, score > "
                              f"{spec.score_thresh_test:g}, NMS {spec.nms_thresh_test}, "
                              f"{spec.detections_per_image} detections"),
            (TRT_ROW, trt)]
    # where the spec's values came from, e.g. what a config-less export had to assume
    rows += [(f"({key})", value) for key, value in spec.provenance.items() if key != "weights"]
    result = ExportResult(src, out, graph, time.perf_counter() - t0, rows)
    if args.verify:
        from norcal.workflows.verify import verify_images

        result.notes.append(verify_images(model, out, args.verify, spec))
    _triton(result, args)
    return result


def triton_name(output: Path) -> str:
    """The Triton model name for an exported file: its name up to the first dot."""
    return output.name.split(".")[0]


def _triton(result: ExportResult, args) -> None:
    """--triton-repo DIR: a Triton model repository serving the written model."""
    if args.triton_repo:
        from norcal.runtime.triton import write_triton_repo

        d = write_triton_repo(result.output, args.triton_repo, triton_name(result.output),
                              force=args.force)
        result.notes.append(f"Triton model repository written: {d}")
