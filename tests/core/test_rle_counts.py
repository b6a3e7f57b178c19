"""The RLE string reader against pycocotools' own encoder and decoder."""

import numpy as np
import pycocotools.mask as mask_utils
import pytest

from norcal.core.rle_counts import counts_problem, decode_counts


def _runs(mask: np.ndarray) -> list[int]:
    """Run lengths of a mask in column-major order, background first (maybe 0), as pycocotools'."""
    flat = np.asarray(mask, np.int8).reshape(-1, order="F")
    runs = np.diff(np.r_[0, np.flatnonzero(np.diff(flat)) + 1, flat.size]).tolist()
    return [0] + runs if flat[0] else runs


@pytest.mark.parametrize("seed", range(20))
def test_decoded_runs_match_pycocotools(seed):
    rng = np.random.default_rng(seed)
    h, w = rng.integers(1, 300, 2)
    mask = np.asfortranarray(rng.random((h, w)) < rng.random() ** 3)
    if seed % 4 == 0:  # long runs: multi-character deltas, both signs
        mask[:] = 0
        mask[h // 3:, w // 2:] = 1
    rle = mask_utils.encode(mask)
    runs = decode_counts(rle["counts"])
    assert sum(runs) == h * w
    assert counts_problem(rle["counts"], int(h), int(w)) is None
    assert counts_problem(rle["counts"].decode(), int(h), int(w)) is None
    back = mask_utils.decode({"size": [int(h), int(w)], "counts": rle["counts"]})
    assert (back == mask).all()
    assert runs == _runs(mask)


def test_frPyObjects_round_trip_of_big_runs():
    """Runs up to 2**29 (5 and 6 characters) read back exactly."""
    for runs in ([0, 2 ** 20, 3, 2 ** 29 - 7, 5, 9], [7, 1, 2 ** 25, 1, 4]):
        h, w = 1, sum(runs)
        s = mask_utils.frPyObjects({"size": [h, w], "counts": runs}, h, w)["counts"]
        assert decode_counts(s) == runs
        assert counts_problem(s, h, w) is None


def test_a_file_too_large_to_sum_still_has_its_strings_form_checked(monkeypatch):
    """Past FULL_CHECK_RECORDS only what pycocotools can read is checked (in C): a garbage string
    is still refused by record; a well-formed string of another size is let through."""
    from norcal.core import rle_counts
    from norcal.core.errors import NorcalError

    monkeypatch.setattr(rle_counts, "FULL_CHECK_RECORDS", 1)
    good = {"size": [2, 2], "counts": "04"}  # four background pixels
    other = {"size": [3, 3], "counts": "04"}  # sums to 4, not 9: not summed in a large file
    rle_counts.check_rle_counts("r.json", "", [{"segmentation": good}, {"segmentation": other}])
    with pytest.raises(NorcalError, match=r"r.json: \[1\]: segmentation.counts: character '!'"):
        rle_counts.check_rle_counts("r.json", "", [{"segmentation": good}, {"segmentation": {"size": [2, 2], "counts": "0!"}}])
    monkeypatch.setattr(rle_counts, "FULL_CHECK_RECORDS", 10)
    with pytest.raises(NorcalError, match="sum to 4, not 3 x 3"):
        rle_counts.check_rle_counts("r.json", "", [{"segmentation": good}, {"segmentation": other}])
