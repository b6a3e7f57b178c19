"""The detectron2 family: ``model_final.pth`` (torch.save of ``{"model": state dict}``) and
model-zoo ``.pkl`` checkpoints, loaded as the shared R-CNN's detectors named as this family's
(:mod:`.detector`: ``Detectron2RCNN``, ``Detectron2RetinaNet``)."""

from __future__ import annotations

import sys
from pathlib import Path

from norcal.export.families.checkpoints import PICKLE_SUFFIXES, TORCH_SUFFIXES
from norcal.export.families.base import Family
from norcal.export.families.detectron2.detector import FAMILY, Detectron2RCNN, Detectron2RetinaNet
from norcal.export.rcnn.detector import GraphOptions, SpecDetector, check_graph_options
from norcal.export.rcnn.rcnn_detector import estimate_cache_bytes as _rcnn_bytes
from norcal.export.rcnn.retinanet_detector import estimate_cache_bytes as _retinanet_bytes
from norcal.export.families.pickle_scan import scan_torch_zip

# what a torch.save of tensors and plain containers names; model-zoo pickles name numpy too
_CHECKPOINT_PACKAGES = frozenset({"torch", "numpy", "collections", "_codecs", "builtins", "__builtin__",
                                  "copyreg", "copy_reg"})


def pickle_packages(path: Path) -> set[str] | None:
    """The top-level packages whose globals a torch zip checkpoint's pickle names (read with
    pickletools, nothing unpickled); None when ``path`` is no torch zip file."""
    scan = scan_torch_zip(path)
    if scan is None:
        return None
    found = {g.split(".", 1)[0] for g in scan.globals}
    return found if found or scan.complete else None


def is_detectron2_checkpoint(path: Path) -> bool:
    """A ``.pth``/``.pt``/``.pkl`` file whose pickle names no class of a non-standard package
    other than torch and numpy (an Ultralytics ``.pt`` pickles ``ultralytics.nn.tasks`` model
    classes; a detectron2 checkpoint holds tensors or arrays only). A file that cannot be
    sniffed is claimed, so that the safe loader says what is wrong with it, in one line; so is
    one naming standard-library globals (the loader refuses those as unsafe)."""
    suffix = path.suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        return True  # model-zoo pickles are detectron2's; the allow-list unpickler reads them
    if suffix not in TORCH_SUFFIXES:
        return False
    packages = pickle_packages(path) if path.is_file() else None
    if packages is None:
        return True
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    return all(p in _CHECKPOINT_PACKAGES or p in stdlib for p in packages)


def _is_retinanet(spec) -> bool:
    from norcal.export.rcnn.spec import RETINANET

    return spec.meta_architecture == RETINANET


def detector_of(spec, model) -> SpecDetector:
    """The family's Detector for a loaded (spec, model): RetinaNet or R-CNN, by the spec."""
    return (Detectron2RetinaNet if _is_retinanet(spec) else Detectron2RCNN)(spec, model)


def estimate_cache_bytes(spec, num_images: int, num_gammas: int = 1) -> int:
    """Upper bound of ``norcal tune``'s cache for ``num_images`` and ``num_gammas`` (an R-CNN's
    serves every gamma; a RetinaNet's holds each gamma's candidates)."""
    if _is_retinanet(spec):
        return _retinanet_bytes(spec, num_images, num_gammas)
    return _rcnn_bytes(spec, num_images)


class Detectron2Family(Family):
    """detectron2 checkpoints: loaded by :func:`norcal.export.families.detectron2.loader.load_model`
    (``weights_only`` / an allow-list unpickler), with an optional config.yaml."""

    name = FAMILY
    reads = ("(Mask / Cascade) R-CNN and RetinaNet checkpoints (.pth, model-zoo .pkl) with their config "
             "(--config, _BASE_ chains and LazyConfigs followed): ResNet, RegNet, ViTDet, MViTv2 backbones; "
             "BGR input, ResizeShortestEdge + padding")
    takes_classifier = True
    takes_host_nms = True
    suffixes = TORCH_SUFFIXES + PICKLE_SUFFIXES

    def claims(self, path: Path, config: Path | None) -> bool:
        return is_detectron2_checkpoint(path)

    def check_export_options(self, options) -> None:
        check_graph_options(options)

    def load(self, path: Path, config: Path | None = None, *,
             detections_per_image: int | None = None, classifier: str | None = None,
             decoding=None) -> SpecDetector:
        """options: ``detections_per_image`` replaces the config's K; ``classifier``: the R-CNN box
        head's activation where the weights cannot tell it (:func:`.loader.load_detector_spec`);
        ``decoding``: only Decoding(nms="host") (:meth:`SpecDetector.with_nms`)."""
        from norcal.export.families.detectron2.loader import load_model

        return detector_of(*load_model(path, config, detections_per_image=detections_per_image,
                                       classifier=classifier)).with_nms(decoding)


__all__ = ["Detectron2Family", "Detectron2RCNN", "Detectron2RetinaNet", "GraphOptions",
           "detector_of", "estimate_cache_bytes", "is_detectron2_checkpoint"]
