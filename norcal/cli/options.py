"""What the subcommands share: options spelled and explained once, the parsers of their
values, the mapping of library parameter names to flags in errors, and progress display."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from norcal.core.errors import NorcalError


def family_lines(indent: str = "  ") -> str:
    """One line per registered family (norcal.export.families.FAMILIES, in the order their claims
    are tried): its name and what it reads."""
    import textwrap

    from norcal.export.families import FAMILIES

    return "\n".join(textwrap.fill(f"{indent}- {f.name}: {f.reads}", 96, subsequent_indent=indent + "  ")
                     for f in FAMILIES)


def family_names(which=lambda family: True) -> str:
    """The registered families' names for which ``which(family)`` holds, "a, b or c"."""
    from norcal.export.families import FAMILIES

    names = [f.name for f in FAMILIES if which(f)]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def checkpoint_help(what: str = "checkpoint") -> str:
    """``what`` and the families whose checkpoints it may be."""
    return f"{what} of a {family_names(lambda f: f.reads_checkpoints)} model (see norcal export --help)"


def table_help(use: str) -> str:
    """A --table help: what the table gives (``use``), then every source norcal.core.calibration.tables
    accepts (argparse help: % escaped)."""
    from norcal.core.calibration.tables import table_sources

    return f"calibration table ({use}): {table_sources()}".replace("%", "%%")


# the decoding's parameters (norcal.core.decoding.Decoding) -> their flags
DECODING_FLAGS = {"decoding": "--decoding", "agnostic_nms": "--agnostic-nms", "conf": "--conf", "nms": "--nms"}


def add_decoding_options(p) -> None:
    """--decoding, --agnostic-nms, --conf: how scores become detections (families with decodings)."""
    from norcal.core.decoding import LABEL_RULES, NMS_PLACES

    g = p.add_argument_group(f"decoding ({family_names(lambda f: bool(f.decodings))} models and their ONNX exports; "
                             "recorded in the model's metadata)")
    g.add_argument("--decoding", choices=LABEL_RULES, default=None,
                   help="multi-label (default: every box x class above --conf, Ultralytics' validator; "
                        "RT-DETR: the top K of queries x classes) or best-class (one label per box, its best "
                        "class after NorCal: Ultralytics' predictor, what deployments run)")
    g.add_argument("--agnostic-nms", action="store_true", default=False,
                   help="best-class YOLO: NMS across classes (Ultralytics' agnostic_nms)")
    g.add_argument("--conf", type=float, default=None,
                   help="score threshold (default 0.001, Ultralytics' validation; its predictor's default is 0.25)")
    g.add_argument("--nms", choices=NMS_PLACES, default=None,
                   help="where YOLO's NMS runs: graph (default, ONNX NonMaxSuppression) or host (the graph ends "
                        "at the calibrated candidates and norcal's runners select them exactly as the graph "
                        "would; for builders without data-dependent layers: norcal build --target rtx)")


CLASSIFIER_FLAGS = {"classifier": "--classifier"}


def add_classifier_option(p) -> None:
    """--classifier softmax|sigmoid: a detectron2 R-CNN's activation where its weights cannot tell it."""
    from norcal.core.calibration.classifier_option import ACTIVATIONS

    p.add_argument("--classifier", choices=ACTIVATIONS, default=None,
                   help=f"{family_names(lambda f: f.takes_classifier)} R-CNN without --config: its box head's "
                        "activation (MODEL.ROI_BOX_HEAD.USE_SIGMOID_CE), which its weights cannot tell; refused "
                        "where the config or the weights say otherwise, and by other families")


def decoding_option(args):
    """The :class:`norcal.core.decoding.Decoding` the flags give, or None when none is given."""
    from norcal.core.decoding import BEST_CLASS, MULTI_LABEL, NMS_GRAPH, Decoding

    given = [flag for name, flag in DECODING_FLAGS.items() if getattr(args, name) not in (None, False)]
    if not given:
        return None
    if args.agnostic_nms and args.decoding != BEST_CLASS:
        # said here with the families that take it: a family that takes no decoding would
        # otherwise hear only "add --decoding best-class", which it refuses next
        raise NorcalError(f"--agnostic-nms needs --decoding {BEST_CLASS} (one label per box), which only "
                          f"{family_names(lambda f: BEST_CLASS in f.decodings)} models take")
    if "--decoding" not in given:
        # a refusal of "the decoding" (a family that takes none) names the flags the user gave,
        # not --decoding, which they did not
        args._flags = {**(getattr(args, "_flags", None) or {}), "decoding": f"decoding ({', '.join(given)})"}
    return Decoding(args.decoding or MULTI_LABEL, args.agnostic_nms, args.conf, args.nms or NMS_GRAPH)


def add_calibration_options(p) -> None:
    """--factor and --mechanism: which NorCal variant (see norcal.core.calibration.formula)."""
    p.add_argument("--factor", choices=("cdt", "ens"), default="cdt",
                   help="a_c = N_c^gamma (cdt, default) or the effective number (ens, gamma < 1)")
    p.add_argument("--mechanism", choices=("exp", "prob", "logit"), default="exp",
                   help="scale the exponentials (default), the probabilities, or the logits")
    p.add_argument("--min-count", type=float, metavar="K",
                   help="raise training counts below K to K (default: a zero count is an error)")


def add_split_argument(p, flag: str) -> None:
    """--split: which split of an Ultralytics data.yaml given as ``flag`` is the ground truth."""
    p.add_argument("--split", choices=("val", "train", "test"), default="val",
                   help=f"when {flag} is an Ultralytics data.yaml: the split whose images and YOLO labels "
                        "are the ground truth (default val; category id = class index + 1)")


def min_count_line(min_count: float, clamped: int, num_classes: int | None = None) -> str:
    """What --min-count did, for the user."""
    of = f" of {num_classes}" if num_classes else ""
    return (f"--min-count {min_count:g}: {clamped}{of} classes had a training count "
            f"below {min_count:g} and were counted as {min_count:g}")


# ----------------------------------------------------------------------------- errors

# library parameter -> flag, for every command; a command's own FLAGS add to or override it
COMMON_FLAGS = {
    "renormalize=False": "--no-renormalize",
    "min_size": "--min-size",
    "max_size": "--max-size",
    "count": "--count",
    "table": "--table",
    "min_count": "--min-count",
}


def error_line(error: NorcalError, flags: Mapping[str, str] | None = None) -> str:
    """The error as the CLI shows it: each parameter the error names spelled as its flag.

    Only whole names outside paths change: "batch" must not touch "batch_size", "--batch" or
    "batch.json", and "checkpoint" not the folder of "/x/checkpoint/m.pth". A word with a path
    separator is a path unless each of its parts is a known parameter ("min_size/max_size")."""
    names = {**COMMON_FLAGS, **(flags or {})}
    pairs = [(p, names[p]) for p in error.params if names.get(p)]
    if not pairs:
        return str(error)
    words = re.split(r"(\s+)", str(error))  # separators kept: the text comes back as it was
    for i, word in enumerate(words):
        parts = re.split(r"[/\\]", word.strip("()[]{},;:'\"`"))
        if len(parts) > 1 and not all(part in names for part in parts):
            continue
        for param, flag in pairs:
            word = re.sub(rf"(?<![\w.-]){re.escape(param)}(?![\w=]|\.\w)", flag, word)
        words[i] = word
    return "".join(words)


# ----------------------------------------------------------------------------- outputs

def check_outputs(inputs=(), files=None, folders=None) -> None:
    """Refuse, before any work, an output that cannot be written or touches one of the inputs.

    inputs: the paths the command reads (None entries and non-paths such as built-in table
    names are ignored); an input folder stands for the image files in it too, and an Ultralytics
    data.yaml for every file and folder of its dataset, which no output may replace, and no
    output file may lie in its image and label folders, existing or not (see :func:`norcal.core.files.outputs.check_apart` for what output folders may
    not do). files / folders: {flag: path or None} of what it writes. Two outputs naming the
    same path are refused too.
    """
    from pathlib import Path

    from norcal.core.files.fileio import same_file
    from norcal.core.files.outputs import check_apart, check_output_dir, check_output_file
    from norcal.core.datasets.ultralytics_dataset import dataset_files, is_dataset_description
    from norcal.runtime.image_files import IMAGE_SUFFIXES

    reads = [Path(p) for p in inputs if p is not None and Path(p).exists()]
    # a data.yaml (an annotations or table argument) names the dataset's images and label files
    datasets = {p: dataset_files(p) for p in reads if p.is_file() and is_dataset_description(p)}
    reads += [f for files_of in datasets.values() for f in files_of]
    # the files an image folder holds are inputs too (folders are searched recursively)
    images = [f for d in reads if d.is_dir() for f in d.rglob("*")
              if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file()]
    check_apart([*reads, *images], files, folders)
    _check_outside_datasets(datasets, files or {})
    seen: list[tuple[str, Path]] = []
    for kinds, check in ((files or {}, check_output_file), (folders or {}, check_output_dir)):
        for flag, path in kinds.items():
            if path is None:
                continue
            path = Path(path)
            for other, p in seen:
                if same_file(p, path):
                    raise NorcalError(f"{flag} {path} is also the {other} output; give each output its own path")
            check(path, flag)
            seen.append((flag, path))


def _check_outside_datasets(datasets: dict, files: dict) -> None:
    """Refuse an output file inside a dataset's image or label folders (any depth), existing or
    not: it would become a label file of an image there, or an image (datasets: {data.yaml:
    its dataset_files})."""
    from pathlib import Path

    folders = [(y, d.resolve()) for y, paths in datasets.items() for d in paths if d.is_dir()]
    for flag, path in files.items():
        if path is None:
            continue
        real = Path(path).resolve()
        for y, d in folders:
            if d in real.parents:
                raise NorcalError(f"{flag} {path} is inside {d}, a folder of the dataset {y}; choose a "
                                  "path outside its image and label folders (inputs are never modified)",
                                  param=flag)


# ----------------------------------------------------------------------------- values

MAX_GAMMAS = 1000  # more is a typo (a tiny step), not a sweep


def parse_gammas(text: str) -> list[float]:
    """'0:1.5:0.1' (start:stop:step, stop included) or '0,0.5,1' -> sorted unique gammas
    (finite, at most :data:`MAX_GAMMAS`)."""
    text = str(text).strip()
    try:
        if ":" in text:
            parts = [float(v) for v in text.split(":")]
            if len(parts) != 3:
                raise ValueError
            if not all(math.isfinite(v) for v in parts):
                raise NorcalError(f"--gammas {text!r}: start, stop and step must be finite")
            start, stop, step = parts
            if step <= 0 or stop < start:
                raise NorcalError(f"--gammas {text!r}: need start <= stop and step > 0")
            n = (stop - start) / step + 1e-9
            if not math.isfinite(n) or n >= MAX_GAMMAS:
                raise NorcalError(f"--gammas {text!r} gives more than {MAX_GAMMAS} gammas: "
                                  "use a larger step")
            values = [round(start + i * step, 10) for i in range(int(math.floor(n)) + 1)]
        else:
            values = [float(v) for v in text.split(",") if v.strip()]
            if not all(math.isfinite(v) for v in values):
                raise NorcalError(f"--gammas {text!r}: every gamma must be finite")
            if len(values) > MAX_GAMMAS:
                raise NorcalError(f"--gammas {text!r}: more than {MAX_GAMMAS} values")
    except ValueError:
        raise NorcalError(f"--gammas {text!r}: expected start:stop:step (e.g. 0:1.5:0.1) "
                          "or a comma list (e.g. 0,0.5,1)") from None
    if not values:
        raise NorcalError(f"--gammas {text!r}: no values")
    return sorted(set(values))


def parse_valid_gammas(text: str, factor: str = "cdt") -> list[float]:
    """:func:`parse_gammas`, each gamma checked for ``factor`` (CDT >= 0, ENS in [0, 1)); an
    error names --gammas and what was typed."""
    from norcal.core.calibration.formula import check_gamma

    gammas = parse_gammas(text)
    try:
        return [check_gamma(g, factor) for g in gammas]
    except NorcalError as e:  # check_gamma speaks of "gamma": name the flag the user typed
        raise NorcalError(f"--gammas {text!r}: {e}") from None


def parse_range(text: str, what: str = "--batch") -> tuple[int, int, int]:
    """``"1:4:8"`` -> (1, 4, 8), positive and ordered; ``"4"`` means 4:4:4."""
    parts = text.split(":")
    if len(parts) == 1:
        parts = parts * 3
    if len(parts) != 3 or not all(re.fullmatch(r"\d+", p) for p in parts):
        raise NorcalError(f"{what} {text!r}: expected MIN:OPT:MAX, e.g. 1:4:8")
    lo, opt, hi = (int(p) for p in parts)
    if not 0 < lo <= opt <= hi:
        raise NorcalError(f"{what} {text!r}: needs 0 < MIN <= OPT <= MAX")
    return lo, opt, hi


def parse_hw(text: str, what: str = "--shape") -> tuple[int, int]:
    """``"800x1088"`` -> (800, 1088)."""
    m = re.fullmatch(r"(\d+)x(\d+)", text.strip().lower())
    if not m or int(m[1]) <= 0 or int(m[2]) <= 0:
        raise NorcalError(f"{what} {text!r}: expected HxW with positive sizes, e.g. 800x1088")
    return int(m[1]), int(m[2])


def parse_hw_range(text: str) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """``"320x320:800x1088:1344x1344"`` -> three (H, W), each dim ordered min <= opt <= max."""
    parts = text.split(":")
    if len(parts) != 3:
        raise NorcalError(f"--shapes {text!r}: expected MINHxMINW:OPTHxOPTW:MAXHxMAXW")
    lo, opt, hi = (parse_hw(p, "--shapes") for p in parts)
    for i, axis in enumerate("HW"):
        if not lo[i] <= opt[i] <= hi[i]:
            raise NorcalError(f"--shapes {text!r}: {axis} needs MIN <= OPT <= MAX")
    return lo, opt, hi


def parse_shape(text: str, what: str = "shape") -> tuple[int, ...]:
    """``"1x3x800x1088"`` -> (1, 3, 800, 1088); a scalar is ``""``. Dims must be positive."""
    if text == "":
        return ()
    parts = text.lower().split("x")
    if not all(re.fullmatch(r"\d+", p) for p in parts):
        raise NorcalError(f"{what} {text!r}: expected dims joined by 'x', e.g. 1x3x800x1088")
    dims = tuple(int(p) for p in parts)
    if any(d <= 0 for d in dims):
        raise NorcalError(f"{what} {text!r}: every dim must be positive")
    return dims


def parse_profile(text: str):
    """Parse ``NAME:MIN:OPT:MAX`` (shapes like 1x3x32x32) into a
    :class:`norcal.core.profiles.Profile`."""
    from norcal.core.profiles import make_profile

    parts = text.split(":")  # input names may hold ':', shapes never do: take the last three
    if len(parts) < 4 or not parts[0]:
        raise NorcalError(f"--profile {text!r}: expected NAME:MIN:OPT:MAX, e.g. images:1x3x32x32:1x3x800x1088:8x3x1344x1344")
    name = ":".join(parts[:-3])
    lo, opt, hi = (parse_shape(p, f"--profile {name}") for p in parts[-3:])
    try:
        return make_profile(name, lo, opt, hi)
    except NorcalError as e:  # the library speaks of "profile for 'x'": name the flag and its text
        raise NorcalError(f"--profile {text!r}: {str(e).split(': ', 1)[-1]}") from None


# ----------------------------------------------------------------------------- progress

def progress_bars(progress):
    """A library progress callback ``(stage, n_done, stage_total)`` drawing one bar per stage
    on a ``rich.progress.Progress``; a stage's bar appears when the stage first reports."""
    tasks: dict[str, object] = {}

    def advance(stage: str, n: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = progress.add_task(stage, total=total)
        progress.advance(tasks[stage], n)

    return advance


# ----------------------------------------------------------------------------- Ray

def add_ray_arguments(p, gpus: bool) -> None:
    """--ray, --ray-address, --num-workers, --max-retries and, where workers can use GPUs,
    --gpus-per-worker."""
    g = p.add_argument_group("Ray (pip install 'norcal-deploy[ray]')")
    # a flag, not an option with an optional value: `--ray MODEL IMAGES` must not take MODEL
    g.add_argument("--ray", action="store_true",
                   help="run on Ray: joins $RAY_ADDRESS or `ray start`'s cluster, else starts Ray here "
                        "(takes no value: give an address with --ray-address)")
    g.add_argument("--ray-address", metavar="ADDRESS",
                   help="the Ray cluster to join (implies --ray): 'auto', HOST:6379 or ray://HOST:10001 "
                        "(checked to answer within a few seconds)")
    g.add_argument("--num-workers", type=int, default=1, help="Ray workers, one model each (default 1)")
    if gpus:
        g.add_argument("--gpus-per-worker", type=float,
                       help="GPUs Ray reserves per worker (default: 1 for --provider cuda/tensorrt and "
                            "engines, else 0)")
    g.add_argument("--max-retries", type=int, default=3,
                   help="times work whose worker failed or died is run again (default 3)")


def ray_options(args, gpu: bool = False):
    """--ray and its flags -> :class:`norcal.runtime.ray_inference.RayOptions` (None without
    --ray, where its flags are refused). Checks that Ray is installed and the cluster it will
    join ($RAY_ADDRESS included) answers, before any work."""
    from norcal.runtime.ray_inference import RayOptions, check_cluster_address, require_ray  # no Ray import

    gpus_flag = getattr(args, "gpus_per_worker", None)
    if not args.ray and args.ray_address is None:
        given = [f for f, v in (("--num-workers", args.num_workers != 1),
                                ("--gpus-per-worker", gpus_flag is not None),
                                ("--max-retries", args.max_retries != 3)) if v]
        if given:
            raise NorcalError(f"{', '.join(given)} only apply with --ray")
        return None
    gpus = gpus_flag if gpus_flag is not None else (1.0 if gpu else 0.0)
    threads = getattr(args, "threads", None) or 1
    options = RayOptions(address=args.ray_address, num_workers=args.num_workers,
                         gpus_per_worker=gpus, cpus_per_worker=1.0 if gpus else float(threads),
                         threads=threads, max_retries=args.max_retries)
    options.check()
    require_ray()
    if options.address in (None, "auto"):  # a cluster found by Ray ($RAY_ADDRESS): checked up front
        check_cluster_address(options.address)
    return options
