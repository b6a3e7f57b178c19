"""A checkpoint whose weights hold NaN or infinity is refused at load, in one line naming the
file and the tensor (every family reading torch weights goes through read_checkpoint)."""

import pytest
import torch

from conftest import TINY
from norcal.core.errors import NorcalError
from norcal.export.families.checkpoints import read_checkpoint


@pytest.mark.parametrize("value, word", [(float("nan"), "NaN"), (float("inf"), "infinite")])
def test_non_finite_weight_is_refused_naming_the_tensor(tmp_path, value, word):
    state = read_checkpoint(TINY / "model_final.pth")
    key = "roi_heads.box_predictor.cls_score.weight"
    state[key] = state[key].clone()
    state[key][1, 2] = value
    path = tmp_path / "m.pth"
    torch.save({"model": state}, path)
    with pytest.raises(NorcalError) as e:
        read_checkpoint(path)
    assert str(e.value) == f"{path}: weight {key!r} holds {word} values (a diverged or corrupt checkpoint)"


def test_torchvision_state_dict_with_nan_is_refused(tmp_path):
    from norcal.export.families import load_detector

    import torchvision
    model = torchvision.models.detection.fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None,
                                                                 num_classes=3)
    state = model.state_dict()
    state["roi_heads.box_predictor.cls_score.weight"][0, 0] = float("nan")
    path = tmp_path / "tv.pth"
    torch.save(state, path)
    with pytest.raises(NorcalError, match=r"weight 'roi_heads.box_predictor.cls_score.weight' holds NaN"):
        load_detector(path)
