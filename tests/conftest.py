from pathlib import Path

import pytest

import fixture_store
from norcal.examples import example_dir

FIXTURES = Path(__file__).parent / "fixtures"
TINY = FIXTURES / "d2_lvis_tiny"
# the bundled example (package data; its images drawn on first use), shared by the demo and the tests
SYNTH = example_dir()
# the session fails on a skip or xfail whose reason is not something a machine may lack
pytest_plugins = ["skip_guard"]


def pytest_configure(config):
    """Rebuild the fixture files from their compact form before any test module is collected."""
    fixture_store.materialize()


@pytest.fixture
def tiny_dir() -> Path:
    return TINY


@pytest.fixture
def synth_dir() -> Path:
    return SYNTH


def assert_tensorrt_compatible(model) -> None:
    """Every model the tests export must pass the TensorRT ONNX-parser check."""
    from norcal.export.trt_check import check_model

    report = check_model(model)
    assert report.compatible, [f"{f.node} ({f.op_type}): {f.reason}" for f in report.errors]


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance for one test module: 2 CPUs, a small object store, no dashboard."""
    import ray

    ray.init(num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False)
    yield ray
    ray.shutdown()


class YoloWork:
    """The Ultralytics tests' checkpoints (trained-at size :attr:`size`), each made once per
    session when a test first needs it, and their calibration table."""

    def __init__(self, d: Path):
        from yolo_models import IMGSZ, write_table  # imports Ultralytics: only Ultralytics tests get here

        self.dir, self.size = d, IMGSZ
        self._graphs: dict = {}
        self.table, self.counts = write_table(d / "table.json")

    def _made(self, name: str, yaml: str, end2end: bool = False) -> Path:
        from yolo_models import make_checkpoint

        p = self.dir / name
        return p if p.exists() else make_checkpoint(p, yaml, imgsz=self.size, end2end=end2end)

    @property
    def det(self) -> Path:
        return self._made("det.pt", "yolo11n.yaml")

    @property
    def seg(self) -> Path:
        return self._made("seg.pt", "yolo11n-seg.yaml")

    @property
    def v8(self) -> Path:
        return self._made("v8.pt", "yolov8n.yaml")

    @property
    def y26(self) -> Path:
        """YOLO26: a DFL-free head (reg_max 1) with a one-to-one branch beside the one-to-many one
        that Ultralytics predicts with by default (its ``nms`` None) and we export."""
        return self._made("y26.pt", "yolo26n.yaml")

    @property
    def y26e2e(self) -> Path:
        """:attr:`y26`'s checkpoint with its end-to-end head selected (``head.end2end = True``):
        Ultralytics then predicts it with the one-to-one branch and a top-k, no NMS, and so do
        our exports."""
        p = self.dir / "y26e2e.pt"
        if not p.exists():
            import torch

            ckpt = torch.load(self.y26, weights_only=False)  # our own test file
            ckpt["model"].model[-1].end2end = True
            torch.save(ckpt, p)
        return p

    @property
    def y26e2e_seg(self) -> Path:
        """:attr:`y26e2e`'s segment model (YOLO26's Segment26 head and Proto26 prototypes)."""
        return self._made("y26e2e_seg.pt", "yolo26n-seg.yaml", end2end=True)

    @property
    def rtdetr(self) -> Path:
        """A tiny RT-DETR (tests/yolo_models.py) with the table's classes, trained at RTDETR_IMGSZ."""
        from yolo_models import make_rtdetr_checkpoint

        p = self.dir / "rtdetr.pt"
        return p if p.exists() else make_rtdetr_checkpoint(p)

    def plain(self, kind: str, decoding=None):
        """(detector, plain ONNX graph) of the ``kind`` ("det" / "seg" / "rtdetr") checkpoint loaded
        with ``decoding`` (a norcal.core.decoding.Decoding; None: the default), exported once per
        session at its trained size (the tests calibrate copies of it)."""
        if (kind, decoding) not in self._graphs:
            from norcal.export.families import load_detector

            det = load_detector(getattr(self, kind), **({} if decoding is None else {"decoding": decoding}))
            self._graphs[kind, decoding] = det, det.export(None)
        return self._graphs[kind, decoding]


@pytest.fixture(scope="session")
def yolo_work(tmp_path_factory) -> YoloWork:
    return YoloWork(tmp_path_factory.mktemp("yolo"))
