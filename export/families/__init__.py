"""Detector families (see :mod:`norcal.export.families.base`) and the functions that pick the family
of a checkpoint file (:func:`resolve`, once per file) and of an ONNX graph (:func:`graph_family`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from norcal.core.decoding import Decoding
from norcal.core.errors import NorcalError
from norcal.export.families.base import Classifier, Detections, Detector, Family, TuneCache
from norcal.export.families.detectron2 import Detectron2Family
from norcal.export.families.foreign import ForeignFamily
from norcal.export.families.pickle_scan import scans_reused
from norcal.export.families.torchvision import TorchvisionFamily
from norcal.export.families.ultralytics import UltralyticsFamily

# Each family in the order their claims are tried; a family module is imported only here.
# Ultralytics first: it claims only files (and graphs) naming its own classes (its own metadata);
# torchvision only state dicts with its key names (backbone.body, rpn.head); detectron2 whatever
# checkpoint is left; foreign, last, every graph left and no checkpoint.
FAMILIES: list[Family] = [UltralyticsFamily(), TorchvisionFamily(), Detectron2Family(), ForeignFamily()]


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint file with the family that claims it (:func:`resolve`) and the pickle scans
    its claims read, which its :meth:`load` reuses instead of reading the file again."""

    family: Family
    path: Path
    config: Path | None
    scans: dict = field(default_factory=dict, compare=False, repr=False)

    def load(self, decoding=None, classifier=None, **options) -> Detector:
        """The detector its family loads (safely: no code from the file runs); ``decoding``
        (:class:`norcal.core.decoding.Decoding`) refused by a family that takes none;
        ``classifier`` ("softmax" or "sigmoid", :mod:`norcal.core.calibration.classifier_option`) likewise."""
        if decoding is not None:
            check_decoding(self.family, decoding)
            options["decoding"] = decoding
        if classifier is not None:
            check_classifier_option(self.family, classifier)
            options["classifier"] = classifier
        with scans_reused(self.scans):
            return self.family.load(self.path, self.config, **options)


def resolve(path, config=None) -> Checkpoint:
    """The checkpoint at ``path`` with the family that claims it, each file scanned once on the
    way; refuses a file no family claims, naming them."""
    p, c = Path(path), None if config is None else Path(config)
    with scans_reused() as scans:
        return Checkpoint(_claimant(p, c), p, c, scans)


def _claimant(p: Path, c: Path | None) -> Family:
    for family in FAMILIES:
        if family.claims(p, c):
            return family
    if c is not None:  # a family's own file given a config it takes none of: its load says so
        for family in FAMILIES:
            if family.claims(p, None):
                return family
    names = ", ".join(f.name for f in FAMILIES if f.reads_checkpoints) or "none"
    raise NorcalError(f"{p}: not a checkpoint of a known detector family ({names})")


def family_of(path, config=None) -> Family:
    """The family whose checkpoint ``path`` is (:func:`resolve`'s)."""
    return resolve(path, config).family


def checkpoint_suffixes() -> tuple[str, ...]:
    """The file suffixes of every family's checkpoints, in registry order: a model file with one
    is read as a checkpoint, any other as ONNX."""
    return tuple(dict.fromkeys(s for f in FAMILIES for s in f.suffixes))


def graph_family(model) -> Family:
    """The family whose ONNX export ``model`` (onnx.ModelProto) is: the first that claims it
    (the foreign family, last, claims any graph)."""
    return next(f for f in FAMILIES if f.claims_graph(model))


def load_detector(path, config=None, decoding=None, classifier=None, **options) -> Detector:
    """The checkpoint at ``path`` loaded by its family (:meth:`Checkpoint.load`)."""
    return resolve(path, config).load(decoding, classifier, **options)


def check_classifier_option(family: Family, classifier) -> None:
    """Refuse a ``classifier`` that is not an activation, or given to a family whose weights or
    design fix the activation (it takes none), naming the parameter."""
    from norcal.core.calibration.classifier_option import check_classifier

    check_classifier(classifier)
    if classifier is not None and not family.takes_classifier:
        raise NorcalError(f"{family.name} checkpoints fix their own activation: they take no classifier option",
                          param="classifier")


def check_decoding(family: Family, decoding) -> None:
    """Refuse a decoding ``family`` cannot take (one that has its own post-processing takes
    none), naming the parameter."""
    if not family.decodings:
        if family.takes_host_nms and decoding == Decoding(nms=decoding.nms):
            return  # the NMS's place only: the loaded detector says whether it can leave it
        raise NorcalError(f"{family.name} checkpoints decode as their own post-processing: they take no "
                          "decoding option", param="decoding")
    if decoding.labels not in family.decodings:
        raise NorcalError(f"{family.name} checkpoints take the {' or '.join(family.decodings)} decoding, "
                          f"not {decoding.labels}", param="decoding")


def checkpoint_runner(weights, config=None, name: str = "pytorch", calibration=None, device: str = "cpu",
                      threads: int | None = None, classifier=None):
    """A checkpoint of any family loaded by :func:`load_detector` (``classifier``: its), as its
    family's PyTorch runner (:class:`norcal.export.pytorch.runner.TorchRunner`) on ``device``."""
    import torch

    runner = load_detector(weights, config, classifier=classifier).torch_runner(calibration, name)
    runner.model = runner.model.to(device)
    runner.device, runner.threads = torch.device(device), threads
    return runner


__all__ = ["Classifier", "Detections", "Detector", "Family", "TuneCache", "FAMILIES", "Checkpoint", "resolve",
           "family_of", "checkpoint_suffixes", "graph_family", "load_detector", "check_decoding", "check_classifier_option", "checkpoint_runner"]
