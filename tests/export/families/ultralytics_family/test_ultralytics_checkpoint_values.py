"""Values an Ultralytics checkpoint saves are range-checked before they size anything: a crafted
``imgsz`` is a one-line error naming the file, not a torch allocation traceback."""

import pytest

from norcal.core.errors import NorcalError
from norcal.export.families.ultralytics.family import DEFAULT_IMGSZ, _imgsz


@pytest.mark.parametrize("raw", [100_000, 0, -640, float("nan"), "640", [100_000, 100_000]])
def test_saved_imgsz_out_of_range_is_refused_naming_the_file(raw):
    with pytest.raises(NorcalError, match=r"^best.pt: saved imgsz must be a finite number >= 32 and <= 8192 "
                                          r"\(the largest export side\), got ") as e:
        _imgsz({"train_args": {"imgsz": raw}}, None, "best.pt")
    assert "\n" not in str(e.value)


def test_saved_imgsz_in_range_is_taken():
    assert _imgsz({"train_args": {"imgsz": 320}}, None, "best.pt") == 320
    assert _imgsz({"train_args": {"imgsz": [640, 640]}}, None, "best.pt") == 640
    assert _imgsz({}, None, "best.pt") == DEFAULT_IMGSZ


@pytest.fixture(scope="module")
def yolo():
    """Ultralytics' own DetectionModel from its yaml (3 classes, strides 8 / 16 / 32)."""
    from ultralytics.nn.tasks import DetectionModel

    return DetectionModel("yolov8n.yaml", nc=3, verbose=False)


@pytest.mark.parametrize("names, field", [
    ({0: "a", 1: "b"}, "the model names 2 classes but its head predicts 3"),
    (["a", "b", "c", "d"], "the model names 4 classes but its head predicts 3"),
    ("abc", "names must be a list or an {index: name} dict of strings, got a str"),
    ({0: "a", 1: None, 2: "c"}, "names must be strings, got None"),
    ([0, 1, 2], "names must be strings, got 0"),
    ({"a": "x", "b": "y", "c": "z"}, "class names are not indexed 0..2"),
    ({0: "a", 1: "b", 5: "c"}, "class names are not indexed 0..2"),
])
def test_saved_names_not_the_heads_classes_are_refused(yolo, names, field):
    from norcal.export.families.ultralytics.yolo import model_names

    saved = yolo.names
    try:
        yolo.names = names
        with pytest.raises(NorcalError) as e:
            model_names(yolo, "best.pt")
    finally:
        yolo.names = saved
    assert str(e.value).startswith("best.pt: ") and field in str(e.value) and "\n" not in str(e.value)


def test_saved_nc_disagreeing_or_out_of_range_is_refused(yolo):
    from norcal.export.families.ultralytics.yolo import model_names

    assert model_names(yolo, "best.pt") == [str(yolo.names[i]) for i in range(3)]
    yolo.yaml["nc"] = 80
    try:
        with pytest.raises(NorcalError, match=r"^best.pt: the model's yaml says nc 80 but its head predicts 3 "):
            model_names(yolo, "best.pt")
    finally:
        yolo.yaml["nc"] = 3
    head = yolo.model[-1]
    for bad in (0, -2, "3"):
        head.nc, saved = bad, head.nc
        try:
            with pytest.raises(NorcalError, match=r"^best.pt: the head's nc must be a whole number >= 1, got "):
                model_names(yolo, "best.pt")
        finally:
            head.nc = saved


@pytest.mark.parametrize("stride", [[8.0, 16.0, 0.0], [-8.0, 16.0, 32.0], [8.0, float("nan"), 32.0],
                                    [8.5, 16.0, 32.0], [8.0, 16.0, 1e9]])
def test_saved_stride_not_positive_is_refused(yolo, stride):
    import torch

    from norcal.export.families.ultralytics.yolo import YoloDetector

    head = yolo.model[-1]
    saved = head.stride
    head.stride = torch.tensor(stride)
    try:
        with pytest.raises(NorcalError, match=r"^best.pt: saved stride must be a whole number >= 1 and <= 8192") as e:
            YoloDetector(yolo, "best.pt", imgsz=64)
    finally:
        head.stride = saved
    assert "\n" not in str(e.value)
    assert YoloDetector(yolo, "best.pt", imgsz=64).stride == 32
