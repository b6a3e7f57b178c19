"""Preprocessing against detectron2's golden sizes and an independent resampler (torch)."""

import json
from pathlib import Path

import numpy as np
import pytest

from norcal.core.contract import Preprocessing
from norcal.core.errors import NorcalError
from norcal.runtime.images import read_rgb
from norcal.runtime.preprocess import prepare_batch, resize_uint8, resized_size

TINY = Path(__file__).parents[1] / "fixtures" / "d2_lvis_tiny"
MIN_SIZE, MAX_SIZE = 320, 512  # the fixture's INPUT.MIN_SIZE_TEST / MAX_SIZE_TEST
IMAGES = [f"img{i}" for i in range(4)]


def golden(name):
    return np.load(TINY / "golden" / f"{name}.npz")


@pytest.mark.parametrize("name", IMAGES)
def test_resized_size_matches_detectron2(name):
    img = read_rgb(TINY / "images" / f"{name}.png")
    g = golden(name)
    assert tuple(g["input_rgb_shape"]) == img.shape[:2]
    assert resized_size(*img.shape[:2], MIN_SIZE, MAX_SIZE) == tuple(g["resized_chw"][1:])


def test_resized_size_hand_computed():
    assert resized_size(480, 640, 800, 1333) == (800, 1067)  # 640 * 800/480 = 1066.67
    assert resized_size(640, 480, 800, 1333) == (1067, 800)
    # long edge capped: 3000 * 0.8 = 2400 > 1333 -> scale 1333/2400; 800 * 0.5554 = 444.3
    assert resized_size(1000, 3000, 800, 1333) == (444, 1333)
    assert resized_size(300, 300, 320, 512) == (320, 320)
    assert resized_size(333, 500, 320, 512) == (320, 480)  # 500 * 320/333 = 480.48


@pytest.mark.parametrize("name", IMAGES)
def test_padded_shape_matches_detectron2(name):
    img = read_rgb(TINY / "images" / f"{name}.png")
    batch = prepare_batch([img], Preprocessing(MIN_SIZE, MAX_SIZE))
    g = golden(name)
    assert batch.images.shape == tuple(g["padded_shape"])
    assert batch.image_sizes.tolist() == [list(g["resized_chw"][1:])]
    assert batch.original_sizes.tolist() == [list(img.shape[:2])]


def _torch_antialiased_bilinear(img, h, w):
    """torch's antialiased bilinear on uint8: an independent implementation of PIL's filter."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))[None]
    out = torch.nn.functional.interpolate(t, size=(h, w), mode="bilinear", antialias=True,
                                          align_corners=False)
    return out[0].numpy().transpose(1, 2, 0)


@pytest.mark.parametrize("name", IMAGES)
def test_resize_pixels_within_one_level_of_reference(name):
    img = read_rgb(TINY / "images" / f"{name}.png")
    h, w = resized_size(*img.shape[:2], MIN_SIZE, MAX_SIZE)
    ours = resize_uint8(img, h, w)
    ref = _torch_antialiased_bilinear(img, h, w)
    assert ours.shape == ref.shape == (h, w, 3)
    diff = np.abs(ours.astype(int) - ref.astype(int))
    assert diff.max() <= 1


def test_resize_downscale_antialiases():
    # Stripes [255,0,0,0] shrunk 4x: PIL's support filter (scaled by the factor) averages each
    # period to 255/4 = 64; a plain 2-tap bilinear would alias to 0 or 255-ish values instead.
    row = np.tile(np.array([255, 0, 0, 0], np.uint8), 16)
    img = np.repeat(np.repeat(row[None, :, None], 8, 0), 3, 2)
    out = resize_uint8(img, 8, 16)
    assert np.all(np.abs(out[:, 1:-1].astype(int) - 64) <= 1)


def test_batch_layout_bgr_and_zero_padding():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)  # no resize: 32 -> 32 short edge
    b = rng.integers(0, 256, (40, 32, 3), dtype=np.uint8)
    batch = prepare_batch([a, b], Preprocessing(32, 1000, input_format="BGR"))
    assert batch.images.dtype == np.float32 and batch.image_sizes.dtype == np.int64
    assert batch.image_sizes.tolist() == [[32, 48], [40, 32]]
    assert batch.images.shape == (2, 3, 64, 64)  # max(32,40)->64, max(48,32)->64
    np.testing.assert_array_equal(batch.images[0, 0, :32, :48], a[:, :, 2])  # B first
    np.testing.assert_array_equal(batch.images[0, 2, :32, :48], a[:, :, 0])
    np.testing.assert_array_equal(batch.images[1, :, :40, :32], b.transpose(2, 0, 1)[::-1])
    assert not batch.images[0, :, 32:].any() and not batch.images[0, :, :, 48:].any()
    assert not batch.images[1, :, 40:].any() and not batch.images[1, :, :, 32:].any()
    rgb = prepare_batch([a], Preprocessing(32, 1000, input_format="RGB", divisibility=1))
    assert rgb.images.shape == (1, 3, 32, 48)
    np.testing.assert_array_equal(rgb.images[0, 0], a[:, :, 0])


@pytest.mark.parametrize("fmt", ["BGR", "RGB"])
def test_stretch_batch_channel_order(fmt):
    from norcal.runtime.preprocess import prepare_stretch_batch

    # solid colours keep their value through any resize: each channel holds one known number
    colours = [(200, 30, 5), (0, 90, 250)]
    images = [np.broadcast_to(np.array(c, np.uint8), (h, w, 3)).copy() for c, (h, w) in zip(colours, [(20, 50), (64, 30)])]
    batch = prepare_stretch_batch(images, 40, 48, fmt)
    assert batch.images.shape == (2, 3, 40, 48) and batch.image_sizes.tolist() == [[40, 48]] * 2
    for b, c in enumerate(colours):
        want = c[::-1] if fmt == "BGR" else c
        for ch in range(3):
            np.testing.assert_array_equal(batch.images[b, ch], np.full((40, 48), want[ch], np.float32))


def test_bad_inputs_raise_norcal_error():
    with pytest.raises(NorcalError, match="image 0"):
        prepare_batch([np.zeros((4, 4), np.uint8)], Preprocessing(32, 64))
    with pytest.raises(NorcalError, match="image 0"):
        prepare_batch([np.zeros((4, 4, 3), np.float32)], Preprocessing(32, 64))
    with pytest.raises(NorcalError, match="at least one"):
        prepare_batch([], Preprocessing(32, 64))
    with pytest.raises(NorcalError, match="BGR or RGB"):
        prepare_batch([np.zeros((4, 4, 3), np.uint8)], Preprocessing(32, 64, input_format="YUV"))


def test_fixture_manifest_sizes_agree_with_reader():
    manifest = json.loads((TINY / "manifest.json").read_text())
    for entry in manifest["images"]:
        img = read_rgb(TINY / entry["file"])
        assert img.shape == (entry["height"], entry["width"], 3) and img.dtype == np.uint8
