"""The detector-family interface: what differs between detectron2, Ultralytics, ... lives here.

A *family* knows one kind of checkpoint file: it says whether a file is its own
(:meth:`Family.claims`) and loads it safely into a :class:`Detector`. A detector is one loaded
model of that family; everything the rest of the product needs from it goes through these
methods, never through ``isinstance`` / ``hasattr`` checks on the model:

- where its classifier logits are and how to read them (:class:`Classifier`: tensor names in
  the exported graph, class axis, background slot, activation);
- how the host prepares images (:class:`norcal.core.contract.Preprocessing`, recorded in the
  graph's metadata, so runners need no family code);
- the plain ONNX graph of our output contract (:meth:`Detector.export`), with the classifier
  logits named so that the surgery puts the NorCal node on them;
- the PyTorch reference for parity (:meth:`Detector.torch_runner`);
- which ONNX graphs are the family's own export and how they become ours
  (:meth:`Family.claims_graph`, :meth:`Family.ingest_graph`);
- the rows the export summary prints about it (:meth:`Detector.describe`), so that no caller
  reads a family's own description of its model;
- what ``norcal tune`` caches from one network pass and re-runs per gamma
  (:meth:`Detector.cache_bytes`, :meth:`Detector.cache`, :meth:`Detector.rescore`).

Adding a family: subclass :class:`Family` and :class:`Detector` in a package
``export/families/<name>/`` whose ``__init__`` re-exports the Family, and list the family in
``export/families/__init__.py``'s ``FAMILIES`` (docs/architecture.md).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Sequence

import numpy as np

from norcal.core.contract import CLS_LOGITS_TENSOR, Classifier  # Classifier: the contract's, re-exported

PathLike = str | os.PathLike


def square_size(options, what: str, kind: str) -> int | None:
    """The options' height = width for a model with a square ``kind`` input (``what`` names the
    model in the message), None when neither is given; one side alone or unequal sides are refused."""
    from norcal.core.errors import NorcalError

    h, w = getattr(options, "height", None), getattr(options, "width", None)
    if h is None and w is None:
        return None
    if h is None or w is None:
        given, missing = ("height", "width") if w is None else ("width", "height")
        raise NorcalError(f"{what} takes a square {kind} input: give height and width, equal "
                          f"({given} {h if w is None else w} given, no {missing})", param=("height", "width"))
    if int(h) != int(w):
        raise NorcalError(f"{what} takes a square {kind} input: height and width must be equal, got {h} and {w}",
                          param=("height", "width"))
    return int(h)


def sigmoid_classifier(logits: str = CLS_LOGITS_TENSOR) -> Classifier:
    """One sigmoid over class logits [.., C] with no background slot (RetinaNet, YOLO, RT-DETR)."""
    return Classifier(logits=(logits,), class_axis=-1, background="none", activation="sigmoid")


@dataclass
class Detections:
    """One image's detections in resized-image coordinates, as the graph outputs them
    (boxes x0,y0,x1,y1; 0-based classes; masks [K, M, M] probabilities or None)."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    masks: np.ndarray | None = None


class TuneCache(ABC):
    """What one network pass over some images leaves for the gamma sweep.

    image_ids: the images' ids, in order; image_sizes int64 [N, 2]: each image's resized (h, w)
    as fed to the graph; original_sizes int64 [N, 2]: its (h, w) as read. The host maps the
    re-scored boxes back to the original images with them, as it does the graph's outputs.
    ``keep_empty_boxes`` (a class attribute): the family keeps boxes the clip leaves with no
    area, as the host does for its graph's outputs (Ultralytics); ``mask_paste``: whose mask
    paste the re-scored masks follow (:class:`norcal.runtime.postprocess.ImageDetections`);
    ``clip_boxes``: the host clips the boxes to the original image (the family's preprocessing
    records whether, :data:`norcal.core.contract.CLIP_BOXES`)."""

    keep_empty_boxes = False  # class attributes, not dataclass fields: no annotation
    mask_paste = "detectron2"
    clip_boxes = True
    drop_empty_masks = False  # detections whose pasted mask is empty are dropped (contract.DROP_EMPTY_MASKS)
    image_ids: list
    image_sizes: np.ndarray
    original_sizes: np.ndarray

    @abstractmethod
    def __len__(self) -> int: ...

    @property
    @abstractmethod
    def nbytes(self) -> int: ...

    @classmethod
    @abstractmethod
    def concat(cls, parts: Sequence["TuneCache"]) -> "TuneCache":
        """Caches of consecutive batches as one, as :meth:`Detector.cache` would have made it
        for all their images (what a distributed network pass joins before re-scoring)."""


class Detector(ABC):
    """One loaded model of a family (PyTorch, eval mode)."""

    family: ClassVar[str]
    model: Any  # torch.nn.Module
    num_classes: int
    topk: int  # detections per image (the graph's K)
    spec: Any = None  # the family's own description of the model, where it has one (detectron2's ModelSpec)
    # where the checkpoint's config records NorCal settings (detectron2: "TEST.CALIBRATION"); None: no config
    calibration_source: ClassVar[str | None] = None

    @property
    @abstractmethod
    def classifier(self) -> Classifier: ...

    @property
    @abstractmethod
    def preprocessing(self):
        """How the host prepares images: a :class:`norcal.core.contract.Preprocessing`."""

    @property
    def has_masks(self) -> bool:
        return False

    @abstractmethod
    def describe(self) -> list[tuple[str, str]]:
        """What the export summary prints about this model, as (label, value) rows: its
        architecture, how the host prepares its input, and the post-processing baked into its
        graph (decoding, score threshold, NMS IoU, detections per image), as the graph's
        ``norcal.detector`` metadata records them; called after :meth:`export` (which may set
        the input size)."""

    def recorded_calibration(self):
        """The NorCal settings the checkpoint's config records (gamma, factor, mechanism,
        renormalize), used when the caller gives no gamma; None where it records none."""
        return None

    def export_options(self, options) -> Any:
        """The options :meth:`export` takes, made from the export job's (batch, height, width,
        opset, mask_head_rois: :class:`norcal.workflows.export_job.CheckpointExport`); refuses,
        in one line naming the parameter, one this loaded model cannot apply. Default: as given."""
        return options

    @abstractmethod
    def export(self, options) -> Any:
        """The plain ONNX graph (onnx.ModelProto, no NorCal node) of our output contract, with
        the runtime and graph metadata set; ``options`` are the export options the family takes."""

    @abstractmethod
    def torch_runner(self, calibration=None, name: str = "pytorch"):
        """A :class:`norcal.core.runner.Runner` running this model in PyTorch on the contract's
        feeds, NorCal applied per ``calibration`` (None: plain)."""

    def noise_runner(self, calibration=None, name: str = "pytorch-fp64"):
        """A runner of this model whose outputs differ from :meth:`torch_runner`'s by float
        rounding alone (parity measures the reference's own float32 noise with it), or None where
        the family has none. Default: the PyTorch runner's model in float64."""
        return self.torch_runner(calibration, name).in_float64(name)

    # --- tuning: one network pass, then re-scoring per gamma
    @abstractmethod
    def cache_bytes(self, num_images: int, num_gammas: int) -> int:
        """Upper bound of :meth:`cache`'s memory for that many images and gammas."""

    @abstractmethod
    def cache(self, batches: Iterable[tuple[list, Any]], priors: Sequence[np.ndarray | None],
              mechanism: str, on_step: Callable[[int], None] | None = None,
              with_masks: bool = False) -> TuneCache:
        """Run the network once over ``batches`` and keep what :meth:`rescore` needs for every
        prior of the sweep (``priors``, in the classifier's layout; None: the plain activation).

        batches: (image ids, batch) pairs; a batch holds ``images`` float32 [B, 3, H, W] and
        ``image_sizes`` int64 [B, 2] as the graph takes them, and ``original_sizes`` int64
        [B, 2], prepared by the host per :attr:`preprocessing` (the export layer reads no
        images). on_step(n): n more images done. with_masks: also what the mask head needs
        (then one batch only: maps of batches padded to different sizes do not stack)."""

    @abstractmethod
    def rescore(self, cache: TuneCache, index: int, prior: np.ndarray | None, mechanism: str,
                batch_size: int) -> dict[str, np.ndarray]:
        """The detections of every cached image at the sweep's ``index``-th prior (``prior``:
        its log prior in the classifier's layout, None for the plain activation), as the
        exported graph calibrated with that prior outputs them: the contract's outputs
        (``num_detections`` [N], ``boxes`` [N, K, 4] in resized-image coordinates, ``scores``,
        ``classes``, and ``masks`` when the cache was made ``with_masks``), in cache order. The
        host maps them to the original images as it maps the graph's outputs."""


class Family(ABC):
    """One kind of checkpoint: which files are its own, and how they load; and, where the family
    has an ONNX export of its own, which graphs are its own and how they become ours."""

    name: ClassVar[str]
    reads: ClassVar[str] = ""  # what files it reads and how their images are prepared (help texts)
    reads_checkpoints: ClassVar[bool] = True  # False: a family of ONNX graphs only (claims no file)
    suffixes: ClassVar[tuple[str, ...]] = ()  # its checkpoints' file suffixes, lower case (".pth")
    # the label rules (norcal.core.decoding) its load takes as ``decoding=``; none: it takes no decoding
    decodings: ClassVar[tuple[str, ...]] = ()
    # whether a family that takes no decoding takes one that only leaves the NMS to the host
    # (Decoding(nms="host")): its one-stage detectors (RetinaNet) honour it, the others refuse it
    takes_host_nms: ClassVar[bool] = False
    # whether its load takes ``classifier=`` (norcal.core.calibration.classifier_option): a family whose weights can
    # leave the activation untold (detectron2 R-CNNs); the others' weights or design fix it
    takes_classifier: ClassVar[bool] = False

    @abstractmethod
    def claims(self, path: Path, config: Path | None) -> bool:
        """Whether ``path`` (and ``config``) is this family's checkpoint; reads at most the
        file's header, runs nothing from it."""

    def check_export_options(self, options) -> None:
        """Refuse, before anything is loaded, an export option (the export job's
        :class:`norcal.workflows.export_job.CheckpointExport`) this family has no use for or
        whose value it cannot take; one line naming the parameter. Default: none refused."""

    @abstractmethod
    def load(self, path: Path, config: Path | None = None, **options) -> Detector:
        """The checkpoint, loaded without running code from the file; errors name the file."""

    def claims_graph(self, model) -> bool:
        """Whether the ONNX graph ``model`` (onnx.ModelProto) is this family's own export, from
        its metadata and structure. Default: none is."""
        return False

    def ingest_graph(self, model, path: Path, calibration, decoding=None) -> tuple[Any, str]:
        """A graph this family claims as our contract's plain graph, ready for the NorCal node
        (``calibration``: the :class:`norcal.core.calibration.spec.Calibration` to bake in; its
        ``logits`` may name the tensor it goes on; ``decoding``: a
        :class:`norcal.core.decoding.Decoding` for the post-processing it appends, None: its
        default), and one line saying what was done ("" for nothing). Errors name ``path``.
        Default: the graph as it is (a decoding refused)."""
        refuse_decoding_of_kept_graph(path, decoding)
        return model, ""


def refuse_decoding_of_kept_graph(path: Path, decoding) -> None:
    """A graph kept as it is keeps its own post-processing: a decoding given for it is refused."""
    from norcal.core.errors import NorcalError

    if decoding is not None:
        raise NorcalError(f"{path}: a decoding applies to graphs converted to our outputs (Ultralytics' ONNX "
                          "exports); this graph is kept as it is, with its own post-processing", param="decoding")
