"""Loading detectron2 checkpoints safely: .pth via weights_only, model-zoo .pkl via a restricted unpickler."""

from __future__ import annotations

import builtins
import collections
import os
import pickle
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from norcal.core.errors import NorcalError
from norcal.export.families.checkpoints import load_state_dict, read_checkpoint

FIXTURES = Path(__file__).parents[3] / "fixtures"
LVIS_PTH = FIXTURES / "d2_lvis_tiny" / "model_final.pth"


@pytest.fixture(scope="module")
def reference():
    """The fixture's weights as torch itself reads them."""
    return torch.load(LVIS_PTH, map_location="cpu", weights_only=True)["model"]


def _assert_same(loaded: dict, expected: dict) -> None:
    assert loaded.keys() == expected.keys()
    for k, v in expected.items():
        assert loaded[k].dtype == v.dtype, k
        assert torch.equal(loaded[k], v), k


def test_pth_in_detectron2_format(reference):
    _assert_same(load_state_dict(LVIS_PTH), reference)


def test_bare_state_dict_with_ddp_prefix_and_ignored_buffers(tmp_path):
    w = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    saved = {
        "module.roi_heads.box_predictor.cls_score.weight": w,
        "module.backbone.bottom_up.res2.0.conv1.norm.num_batches_tracked": torch.tensor(5),
        "module.proposal_generator.anchor_generator.cell_anchors.0": torch.zeros(3, 4),
        "module.pixel_mean": torch.tensor([1.0, 2.0, 3.0]).reshape(3, 1, 1),
        "module.pixel_std": torch.tensor([4.0, 5.0, 6.0]).reshape(3, 1, 1),
    }
    path = tmp_path / "bare.pth"
    torch.save(saved, path)
    sd = load_state_dict(path)
    assert set(sd) == {"roi_heads.box_predictor.cls_score.weight", "pixel_mean", "pixel_std"}
    assert torch.equal(sd["roi_heads.box_predictor.cls_score.weight"], w)
    assert sd["pixel_mean"].flatten().tolist() == [1.0, 2.0, 3.0]
    # the raw reader keeps the BN counter (it tells BN from FrozenBN)
    assert "backbone.bottom_up.res2.0.conv1.norm.num_batches_tracked" in read_checkpoint(path)


def _numpy_state(reference):
    return collections.OrderedDict((k, v.numpy().copy()) for k, v in reference.items())


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_model_zoo_pkl_loads_same_tensors_as_pth(tmp_path, reference, protocol):
    path = tmp_path / "model_final_abc.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": _numpy_state(reference), "__author__": "Detectron2 Model Zoo"}, f, protocol=protocol)
    _assert_same(load_state_dict(path), reference)


def test_pkl_written_by_numpy_1x(tmp_path):
    # numpy 1.x names its reconstructor numpy.core.multiarray; GLOBAL opcodes are plain text lines
    arrays = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array([7], dtype=np.int64)}
    data = pickle.dumps({"model": arrays, "__author__": "x"}, protocol=2)
    assert b"numpy._core.multiarray" in data
    data = data.replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")
    path = tmp_path / "old.pkl"
    path.write_bytes(data)
    sd = load_state_dict(path)
    assert torch.equal(sd["a"], torch.arange(12, dtype=torch.float32).reshape(3, 4))
    assert sd["b"].tolist() == [7]


def test_bare_pkl_with_matching_heuristics(tmp_path):
    path = tmp_path / "bare.pkl"
    with open(path, "wb") as f:
        pickle.dump({"w": np.ones((2, 2), np.float32), "matching_heuristics": True, "__author__": "me"}, f)
    sd = load_state_dict(path)
    assert list(sd) == ["w"] and torch.equal(sd["w"], torch.ones(2, 2))


class _Evil:
    """Pickles to a call of ``func(*args)`` at load time."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _evil_payloads(marker: Path):
    cmd = f"touch {marker}"
    return [
        (_Evil(os.system, cmd), f"{os.system.__module__}.system"),
        (_Evil(builtins.eval, f"__import__('os').system({cmd!r})"), "builtins.eval"),
        (_Evil(subprocess.call, ["touch", str(marker)]), "subprocess.call"),
    ]


@pytest.mark.parametrize("which", [0, 1, 2])
def test_malicious_pkl_is_refused_without_running(tmp_path, which):
    marker = tmp_path / "pwned"
    payload, global_name = _evil_payloads(marker)[which]
    path = tmp_path / "model_final.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": {"backbone.x": np.zeros(2), "evil": payload}, "__author__": "x"}, f, protocol=4)
    with pytest.raises(NorcalError) as err:
        load_state_dict(path)
    assert global_name in str(err.value)
    assert str(path) in str(err.value)
    assert not marker.exists()


def test_malicious_pkl_protocol2_names_python3_global(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "m.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": _Evil(builtins.eval, f"open({str(marker)!r}, 'w')")}, f, protocol=2)
    with pytest.raises(NorcalError, match=r"__builtin__\.eval \(builtins\.eval\)"):
        load_state_dict(path)
    assert not marker.exists()


def test_malicious_pth_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "model_final.pth"
    torch.save({"model": {"w": torch.zeros(2), "evil": _Evil(os.system, f"touch {marker}")}}, path)
    with pytest.raises(NorcalError, match="weights_only") as err:
        load_state_dict(path)
    assert str(path) in str(err.value)
    assert not marker.exists()


def test_codecs_only_for_latin1(tmp_path):
    # _codecs.encode is admitted for protocol-2 bytes, but not with other codecs
    data = b"\x80\x02c_codecs\nencode\nX\x03\x00\x00\x00abcX\x05\x00\x00\x00rot13\x86R."
    path = tmp_path / "codec.pkl"
    path.write_bytes(data)
    with pytest.raises(NorcalError, match="rot13"):
        load_state_dict(path)


@pytest.mark.parametrize("suffix", [".pth", ".pkl"])
def test_truncated_file(tmp_path, reference, suffix):
    path = tmp_path / f"cut{suffix}"
    if suffix == ".pth":
        torch.save({"model": reference}, path)
    else:
        with open(path, "wb") as f:
            pickle.dump({"model": _numpy_state(reference)}, f)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(NorcalError, match="truncated or corrupt") as err:
        load_state_dict(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("suffix", [".pth", ".pkl"])
def test_garbage_file(tmp_path, suffix):
    path = tmp_path / f"junk{suffix}"
    path.write_bytes(b"this is not a checkpoint at all\n" * 10)
    with pytest.raises(NorcalError, match=str(path)):
        load_state_dict(path)


def test_unknown_suffix_and_missing_file(tmp_path):
    path = tmp_path / "weights.h5"
    path.write_bytes(b"\x89HDF")
    with pytest.raises(NorcalError, match=r"unknown checkpoint type '\.h5'"):
        load_state_dict(path)
    with pytest.raises(NorcalError, match=r"nope.pth: no such file$"):
        load_state_dict(tmp_path / "nope.pth")


def test_caffe2_blobs_and_non_array_entries(tmp_path):
    path = tmp_path / "c2.pkl"
    with open(path, "wb") as f:
        pickle.dump({"blobs": {"conv1_w": np.zeros((64, 3, 7, 7), np.float32)}}, f)
    with pytest.raises(NorcalError, match="Caffe2"):
        load_state_dict(path)
    path = tmp_path / "strs.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": {"w": "not an array"}}, f)
    with pytest.raises(NorcalError, match="'w'"):
        load_state_dict(path)


def test_torch_zip_named_pkl_says_to_use_pth(tmp_path):
    """A torch.save zip given the model zoo's .pkl suffix was called a truncated or corrupt
    pickle; the error says what the file is and which suffix reads it."""
    p = tmp_path / "model_final.pkl"
    torch.save({"model": {"w": torch.zeros(2)}}, p)
    with pytest.raises(NorcalError, match=r"model_final.pkl: a PyTorch \(torch.save zip\) checkpoint, not a "
                                          r"model-zoo pickle: give it the .pth suffix") as e:
        read_checkpoint(p)
    assert "truncated" not in str(e.value)
