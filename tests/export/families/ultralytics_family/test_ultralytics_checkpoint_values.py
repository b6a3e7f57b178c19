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
