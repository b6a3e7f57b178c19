"""The runtime's one batching path: prepared_batches (chunks, lazily read) and iter_images."""

import numpy as np
import pytest
from PIL import Image

from norcal.core.contract import Preprocessing
from norcal.core.errors import NorcalError
from norcal.runtime.images import iter_images, read_images
from norcal.runtime.inference import prepared_batches
from norcal.runtime.preprocess import prepare_batch

SPEC = Preprocessing(min_size=32, max_size=64, input_format="RGB", divisibility=16)


def _images(n):
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (20 + 7 * i, 30 + 5 * i, 3), dtype=np.uint8) for i in range(n)]


def test_batches_equal_prepare_batch_on_each_chunk():
    imgs = _images(5)
    batches = list(prepared_batches(imgs, SPEC, 2))
    assert [len(b) for b in batches] == [2, 2, 1]
    for b, chunk in zip(batches, (imgs[0:2], imgs[2:4], imgs[4:])):
        ref = prepare_batch(chunk, Preprocessing(32, 64, "RGB", 16))
        np.testing.assert_array_equal(b.images, ref.images)
        np.testing.assert_array_equal(b.image_sizes, ref.image_sizes)
        np.testing.assert_array_equal(b.original_sizes, ref.original_sizes)


def test_images_are_taken_as_needed_and_bad_batch_size_is_refused_at_once():
    taken = []

    def lazy():
        for i, im in enumerate(_images(4)):
            taken.append(i)
            yield im

    batches = prepared_batches(lazy(), SPEC, 3)
    assert taken == []
    next(batches)
    assert taken == [0, 1, 2]
    with pytest.raises(NorcalError, match="batch size must be >= 1, got 0"):
        prepared_batches(lazy(), SPEC, 0)


def test_iter_images_reads_one_at_a_time(tmp_path):
    paths = []
    for i, im in enumerate(_images(2)):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(im).save(paths[-1])
    (tmp_path / "bad.png").write_bytes(b"not an image")
    it = iter_images([*paths, tmp_path / "bad.png"], "ctx: ")
    np.testing.assert_array_equal(next(it), _images(2)[0])  # read before the bad file is reached
    next(it)
    with pytest.raises(NorcalError, match="ctx: .*bad.png: cannot read the image"):
        next(it)
    assert len(read_images(paths)) == 2
