"""Reading image files as the detectors' hosts do: EXIF orientation as detectron2's read_image
applies it, 16-bit greyscale as OpenCV's imread reads it, other pixel types refused."""

import cv2
import numpy as np
import pytest
from PIL import Image

from norcal.runtime.images import read_rgb, unreadable_files

# EXIF orientation -> the stored pixels made upright, per the EXIF 2.32 spec (detectron2's
# _apply_exif_orientation: 2 FLIP_LEFT_RIGHT, 3 ROTATE_180, 4 FLIP_TOP_BOTTOM, 5 TRANSPOSE,
# 6 ROTATE_270, 7 TRANSVERSE, 8 ROTATE_90)
UPRIGHT = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.swapaxes(0, 1),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a[::-1, ::-1].swapaxes(0, 1),
    8: lambda a: np.rot90(a, 1),
}


@pytest.mark.parametrize("orientation", sorted(UPRIGHT))
def test_exif_orientation_is_applied(tmp_path, orientation):
    stored = np.random.default_rng(orientation).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / "x.png"
    Image.fromarray(stored).save(path, exif=exif)
    np.testing.assert_array_equal(read_rgb(path), UPRIGHT[orientation](stored))


def test_16_bit_greyscale_is_read_as_opencv_reads_it(tmp_path):
    # Pillow's convert("RGB") clips 16-bit values at 255: a white image, with no word
    values = (np.arange(3 * 256, dtype=np.uint32).reshape(3, 256) * 85 + 7).astype(np.uint16)
    path = tmp_path / "g16.png"
    Image.fromarray(values).save(path)
    assert Image.open(path).mode == "I;16"
    want = cv2.imread(str(path), cv2.IMREAD_COLOR)[..., ::-1]  # the high byte, in 3 channels
    np.testing.assert_array_equal(read_rgb(path), want)
    np.testing.assert_array_equal(read_rgb(path)[..., 0], values >> 8)


@pytest.mark.parametrize("mode", ["I", "F"])
def test_32_bit_pixels_are_refused_in_one_line(tmp_path, mode):
    path = tmp_path / f"{mode}.tif"
    Image.fromarray(np.full((4, 4), 1000, np.int32 if mode == "I" else np.float32)).save(path)
    assert Image.open(path).mode == mode
    with pytest.raises(ValueError, match=f"mode {mode}"):
        read_rgb(path)
    [(bad, why)] = unreadable_files([path], skip=True)  # refused before any work
    assert bad == path and f"mode {mode}" in why and "\n" not in why


def test_folders_are_searched_without_hidden_files_and_folders(tmp_path):
    # as the shell's and glob's * (and Ultralytics' folder listing): macOS's AppleDouble
    # "._name.jpg" files and folders such as .ipynb_checkpoints/ are no input images
    from norcal.runtime.image_files import expand_inputs

    img = tmp_path / "d" / "a.png"
    img.parent.mkdir()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(img)
    (tmp_path / "d" / "._a.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    (tmp_path / "d" / ".cache").mkdir()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "d" / ".cache" / "b.png")
    (tmp_path / "d" / "sub").mkdir()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "d" / "sub" / "c.png")
    assert expand_inputs([tmp_path / "d"]) == [img, tmp_path / "d" / "sub" / "c.png"]
    # a hidden file named on its own is taken, and a hidden folder given as the input is searched
    assert expand_inputs([tmp_path / "d" / "._a.png"]) == [tmp_path / "d" / "._a.png"]
    assert expand_inputs([tmp_path / "d" / ".cache"]) == [tmp_path / "d" / ".cache" / "b.png"]


def test_a_dangling_image_link_in_a_folder_is_listed_not_dropped(tmp_path):
    # a broken link named like an image is an image the user meant and cannot be read: it
    # must reach the reader (error, or skipped and counted), not vanish from the count
    from norcal.core.errors import NorcalError
    from norcal.runtime.image_files import expand_inputs
    from norcal.runtime.images import read_images

    d = tmp_path / "d"
    d.mkdir()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(d / "a.png")
    (d / "b.png").symlink_to(tmp_path / "gone.png")
    assert expand_inputs([d]) == [d / "a.png", d / "b.png"]
    with pytest.raises(NorcalError, match="b.png"):
        read_images(expand_inputs([d]))
    skipped = []
    assert len(read_images(expand_inputs([d]), skipped=skipped)) == 1
    assert [p for p, _ in skipped] == [d / "b.png"]
