"""The RLE string reader against pycocotools' own encoder and decoder."""

import numpy as np
import pycocotools.mask as mask_utils
import pytest

from norcal.core.datasets.rle_counts import counts_problem, decode_counts


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


def test_vectorised_sums_match_pycocotools_and_the_reader():
    """All strings decoded at once: pycocotools' own encodings sum to h x w; random well-formed
    strings give decode_counts' sum, or are negative exactly where it refuses them."""
    import random

    from norcal.core.errors import NorcalError
    from norcal.core.datasets.rle_counts import _run_sums

    rng, rnd = np.random.default_rng(1), random.Random(1)
    strings, expected = [], []
    for seed in range(60):
        h, w = (int(v) for v in rng.integers(1, 300, 2))
        mask = np.asfortranarray(rng.random((h, w)) < rng.random() ** 3)
        if seed % 3 == 0:
            mask[:] = 0
            mask[h // 3:, w // 2:] = 1
        strings.append(mask_utils.encode(mask)["counts"])
        expected.append((h * w, False))
    for _ in range(300):
        s = "".join("".join(rnd.choices("PQRSTUVWXYZ[\\]^_`abcdefghijklmno", k=rnd.randint(0, 5)))
                    + rnd.choice("0123456789:;<=>?@ABCDEFGHIJKLMNO") for _ in range(rnd.randint(0, 12)))
        strings.append(s.encode())
        try:
            expected.append((sum(decode_counts(s)), False))
        except NorcalError:
            expected.append((None, True))
    sums, negative = _run_sums(strings)
    assert negative.tolist() == [n for _, n in expected] and 50 < negative.sum() < 300
    assert [int(v) for v, n in zip(sums, negative) if not n] == [v for v, n in expected if not n]


def test_every_record_of_a_large_file_is_summed(monkeypatch):
    """Runs are summed for every record, past 10,000 records and across the chunks decoded
    together; the first bad record (wrong sum, negative run or malformed) is the one named."""
    from norcal.core.datasets import rle_counts
    from norcal.core.errors import NorcalError

    good = {"segmentation": {"size": [2, 2], "counts": "04"}}  # four background pixels
    other = {"segmentation": {"size": [3, 3], "counts": "04"}}  # sums to 4, not 9
    rle_counts.check_rle_counts("r.json", "", [good] * 20_000)
    with pytest.raises(NorcalError, match=r"^r.json: \[19999\]: segmentation.counts: RLE counts sum to 4, not 3 x 3"):
        rle_counts.check_rle_counts("r.json", "", [good] * 19_999 + [other])
    monkeypatch.setattr(rle_counts, "_CHUNK", 8)  # a chunk every few records
    garbage = {"segmentation": {"size": [2, 2], "counts": "0!"}}
    negative = {"segmentation": {"size": [2, 2], "counts": "1O"}}  # 1, then -1
    for records, first in (([good] * 9 + [other] + [good] * 5 + [garbage], 9),
                           ([good] * 9 + [garbage] + [other], 9), ([good] * 3 + [other, garbage], 3),
                           ([good] * 12 + [negative], 12)):
        with pytest.raises(NorcalError, match=rf"^r.json: \[{first}\]: segmentation.counts: ") as e:
            rle_counts.check_rle_counts("r.json", "", records)
        bad = records[first]["segmentation"]
        assert str(e.value).endswith(rle_counts.counts_problem(bad["counts"], *bad["size"]))
