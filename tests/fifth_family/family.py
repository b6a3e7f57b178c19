"""A toy family (used by the test that adds a family): ``.toy`` JSON files holding one linear box
classifier over an image's mean colour; each image gets one detection, the whole image, of its
best foreground class."""

from __future__ import annotations

import json
from pathlib import Path

from norcal.core import contract
from norcal.core.errors import NorcalError
from norcal.core.files.fileio import read_json
from norcal.export.families.base import Classifier, Detector, Family
from norcal.export.pytorch.onnx_trace import MIN_OPSET, trace_onnx


class ToyDetector(Detector):
    family = "toy"
    topk = 1

    def __init__(self, weight, bias):
        import torch

        self.num_classes = len(weight) - 1
        self.model = torch.nn.Linear(3, self.num_classes + 1)
        with torch.no_grad():
            self.model.weight.copy_(torch.tensor(weight))
            self.model.bias.copy_(torch.tensor(bias))

    @property
    def classifier(self) -> Classifier:
        return Classifier(("cls_logits",), -1, "last", "softmax")

    @property
    def preprocessing(self):
        return contract.Preprocessing(min_size=32, max_size=64, input_format="RGB", divisibility=1)

    def describe(self):
        return [("architecture", f"toy linear classifier, {self.num_classes} classes")]

    def export(self, options=None):
        import onnx
        import torch

        linear = self.model

        class Graph(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.cls_score = linear

            def forward(self, images, image_sizes):
                size = image_sizes.to(torch.float32)
                # the mean over the image itself, not its batch's zero padding: alone == batched
                mean = images.sum(dim=(2, 3)) / (size[:, :1] * size[:, 1:])
                logits = self.cls_score(mean / 255.0)[:, None, :]  # [B, 1, C+1]
                score, cls = torch.softmax(logits, dim=-1)[:, :, :-1].max(dim=-1)
                zero = torch.zeros_like(size[:, 0])
                boxes = torch.stack([zero, zero, size[:, 1], size[:, 0]], dim=-1)[:, None, :]
                num = torch.ones_like(image_sizes[:, 0]).to(torch.int32)
                return num, boxes, score, cls.to(torch.int32), logits

        images = torch.rand(1, 3, 40, 48) * 255.0
        sizes = torch.tensor([[40, 48]], dtype=torch.int64)
        outputs = list(contract.OUTPUT_NAMES[:4])
        proto = trace_onnx(Graph().eval(), (images, sizes), contract.INPUT_NAMES, [*outputs, "cls_logits"],
                           MIN_OPSET, {"images": {0: "batch", 2: "height", 3: "width"},
                                      **{n: {0: "batch"} for n in (contract.INPUT_NAMES[1], *outputs)}},
                           internal=["cls_logits"])
        onnx.helper.set_model_props(proto, {**self.preprocessing.metadata(), contract.NUM_CLASSES: str(self.num_classes),
                                            contract.DETECTOR: json.dumps({"toy": True}),
                                            **contract.classifier_metadata(self.classifier)})
        return proto

    def torch_runner(self, calibration=None, name: str = "pytorch"):
        raise NorcalError("the toy family has no PyTorch runner")

    def cache_bytes(self, num_images, num_gammas):
        raise NorcalError("the toy family does not tune")

    def cache(self, batches, priors, mechanism, on_step=None, with_masks=False):
        raise NorcalError("the toy family does not tune")

    def rescore(self, cache, index, prior, mechanism, batch_size):
        raise NorcalError("the toy family does not tune")


class ToyFamily(Family):
    name = "toy"
    suffixes = (".toy",)
    reads = "toy .toy files (a linear classifier over the mean colour)"

    def claims(self, path: Path, config: Path | None) -> bool:
        return path.suffix == ".toy" and config is None

    def load(self, path: Path, config: Path | None = None, **options) -> Detector:
        data = read_json(path, "toy model")
        if not isinstance(data, dict) or set(data) != {"weight", "bias"}:
            raise NorcalError(f"{path}: a toy model holds exactly 'weight' and 'bias'")
        return ToyDetector(data["weight"], data["bias"])
