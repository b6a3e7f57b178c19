"""detectron2 checkpoints (model_final.pth, model-zoo .pkl) with an optional config.yaml."""

from norcal.export.families.detectron2.family import Detectron2Family

__all__ = ["Detectron2Family"]
