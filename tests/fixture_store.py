"""The detectron2 fixtures as the repository stores them, and how they are rebuilt for the tests.

The repository keeps the fixtures compact (tests/fixtures/README.md says what each costs);
``materialize()`` rebuilds the files the tests read, in their original layout and bytes
(checkpoints and detectron2's ONNX export are verified by sha256, golden arrays one by one),
once per checkout: conftest.py calls it before collection, the bench scripts before they run.

- Checkpoints: ``weights/tensors.xz`` holds every distinct tensor of the first five fixture
  checkpoints once (several share tensors), byte planes separated so xz compresses the
  float exponents; a fixture added later has its own ``weights/<fixture>.xz`` (so adding one
  leaves the others' bytes alone); ``weights/index.json`` lists each checkpoint's keys and blob. ``torch.save`` of the
  rebuilt state dict gives the original file, byte for byte.
- Goldens ``<fixture>/packed/golden/imgK.npz``: detectron2's ``cls_logits`` / ``box_deltas`` [1000, C]
  are stored as the box-head features they were computed from (recovered by least squares;
  the rebuilt logits are features @ W.T + b with the checkpoint's predictor, within the bound
  recorded per array, 1e-5 or less); RetinaNet's full-level logits likewise as the subnet's
  output (rebuilt by its 3x3 ``cls_score`` conv); masks repeated across settings are stored
  once; integer arrays in the smallest type that holds them. Every other array is bit-exact.
- ``d2_lvis_tiny/detectron2_export_800x1216.onnx`` (from ``d2_lvis_tiny/packed/onnx/``): the
  graph without its weights, each
  initializer rebuilt from the checkpoint (copied, or FrozenBN folded into the conv) and
  corrected by a stored XOR of the bits where the folding differs.
- ``images/``: the test images, shared by every fixture.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import shutil
from collections import OrderedDict
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).parent / "fixtures"
WEIGHTS = FIXTURES / "weights"
IMAGES = FIXTURES / "images"
STAMP = ".materialized"  # holds the hash of the packed inputs the files were rebuilt from
D2_ONNX = "d2_lvis_tiny/detectron2_export_800x1216.onnx"
MAIN_BLOB = "tensors.xz"  # the first five fixtures' tensors; a later fixture has a blob of its own


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def array_sha(a: np.ndarray) -> str:
    return sha256(str(a.dtype).encode() + str(a.shape).encode() + np.ascontiguousarray(a).tobytes())


def shuffle4(blob: bytes) -> bytes:
    """Byte planes of 4-byte words (the blob's length is a multiple of 4)."""
    return np.frombuffer(blob, np.uint8).reshape(-1, 4).T.tobytes()


def unshuffle4(blob: bytes) -> bytes:
    return np.frombuffer(blob, np.uint8).reshape(4, -1).T.tobytes()


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _packed_inputs_hash() -> str:
    h = hashlib.sha256()
    for p in sorted(FIXTURES.rglob("*")):
        parts = p.relative_to(FIXTURES).parts
        if p.is_file() and (parts[0] in ("weights", "images") or "packed" in parts):
            h.update(str(p.relative_to(FIXTURES)).encode())
            st = p.stat()
            h.update(f"{st.st_size}".encode())
            h.update(sha256(p.read_bytes()).encode())
    return h.hexdigest()


# -- checkpoints ---------------------------------------------------------------------------

def _state_dicts() -> dict[str, "OrderedDict[str, np.ndarray]"]:
    index = json.loads((WEIGHTS / "index.json").read_text())
    blobs: dict[str, bytes] = {}
    out = {}
    for rel, entry in index["files"].items():
        name = entry.get("blob", MAIN_BLOB)
        if name not in blobs:
            blobs[name] = unshuffle4(lzma.decompress((WEIGHTS / name).read_bytes()))
        blob = blobs[name]
        sd = OrderedDict()
        for key, dtype, shape, offset, nbytes in entry["tensors"]:
            sd[key] = np.frombuffer(blob, dtype=dtype, count=nbytes // np.dtype(dtype).itemsize,
                                    offset=offset).reshape(shape)
        out[rel] = (sd, entry["sha256"], entry.get("metadata", []))
    return out


def _plain_states() -> dict[str, dict[str, np.ndarray]]:
    return {rel.split("/")[0]: sd for rel, (sd, _, _) in _state_dicts().items()}


def _save_checkpoint(sd, expected: str, metadata: list, path: Path) -> None:
    import torch

    state = OrderedDict((k, torch.from_numpy(v.copy())) for k, v in sd.items())
    if metadata:  # torch's per-module versions, pickled with a state dict
        state._metadata = OrderedDict((k, v) for k, v in metadata)
    buf = io.BytesIO()
    torch.save({"model": state}, buf)
    data = buf.getvalue()
    if sha256(data) != expected:
        raise RuntimeError(f"{path}: rebuilt checkpoint differs from the original (sha256)")
    _write(path, data)


# -- goldens -------------------------------------------------------------------------------

def _rebuild_golden(packed: Path, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import torch

    with np.load(packed) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(bytes(arrays.pop("__meta__")).decode())
    out = {}
    for name, recipe in meta["rebuild"].items():
        kind = recipe["kind"]
        if kind == "linear":
            x = arrays[recipe["features"]].astype(np.float64)
            w, b = state[recipe["weight"]].astype(np.float64), state[recipe["bias"]].astype(np.float64)
            got = (x @ w.T + b).astype(np.float32)
        elif kind == "conv3x3":
            x = torch.from_numpy(arrays[recipe["features"]].astype(np.float64))[None]
            w = torch.from_numpy(state[recipe["weight"]].astype(np.float64))
            b = torch.from_numpy(state[recipe["bias"]].astype(np.float64))
            got = torch.nn.functional.conv2d(x, w, b, padding=1)[0].numpy().astype(np.float32)
        elif kind == "rows":
            got = arrays[recipe["unique"]][arrays[recipe["rows"]].astype(np.int64)]
        elif kind == "cast":
            got = arrays[recipe["stored"]].astype(recipe["dtype"])
        else:
            raise RuntimeError(f"{packed}: unknown recipe {kind}")
        out[name] = got
    for name in meta["order"]:
        if name not in out:
            out[name] = arrays[name]
        bound = meta["bounds"].get(name)
        if bound is None:
            if array_sha(out[name]) != meta["sha256"][name]:
                raise RuntimeError(f"{packed}: {name} differs from detectron2's array")
        elif out[name].shape != tuple(meta["shapes"][name]):
            raise RuntimeError(f"{packed}: {name} has the wrong shape")
    return {name: out[name] for name in meta["order"]}


# -- detectron2's ONNX export --------------------------------------------------------------

def fold_frozen_bn(state: dict[str, np.ndarray], prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """Conv weight and bias with the conv's FrozenBN folded in, in float32 numpy (IEEE-exact
    elementwise ops, so every CPU gives the same bits; torch's vectorised kernels round
    differently on different CPUs). residual.npz holds where the exporter's fold rounded otherwise."""
    t = {k: np.asarray(state[f"{prefix}.norm.{k}"], np.float32) for k in ("weight", "bias", "running_mean", "running_var")}
    scale = t["weight"] / np.sqrt(t["running_var"] + np.float32(1e-5))
    w = np.asarray(state[f"{prefix}.weight"], np.float32) * scale.reshape(-1, 1, 1, 1)
    return w, t["bias"] - t["running_mean"] * scale


def _rebuild_onnx(skeleton: Path, residual: Path, state: dict[str, np.ndarray], expected: str, path: Path) -> None:
    import onnx

    model = onnx.load(str(skeleton))
    recipes = json.loads((skeleton.parent / "recipes.json").read_text())
    with np.load(residual) as z:
        xor = {k: z[k] for k in z.files}
    for t in model.graph.initializer:
        src, key, part = recipes[t.name]
        if src == "checkpoint":
            base = state[key]
        else:
            base = fold_frozen_bn(state, key)[0 if part == "weight" else 1]
        bits = np.ascontiguousarray(base, np.float32).view(np.uint32)
        if t.name in xor:
            bits = bits ^ xor[t.name].reshape(bits.shape)
        t.raw_data = bits.tobytes()
    data = model.SerializeToString()
    if sha256(data) != expected:
        raise RuntimeError(f"{path}: rebuilt ONNX differs from detectron2's export (sha256)")
    _write(path, data)


# -- the whole store -----------------------------------------------------------------------

def materialize() -> None:
    """Rebuild every fixture file the tests read (once per checkout; cheap when done)."""
    stamp = FIXTURES / STAMP
    want = _packed_inputs_hash()
    manifest = json.loads((WEIGHTS / "materialized.json").read_text())
    if stamp.exists() and stamp.read_text() == want and all((FIXTURES / f).exists() for f in manifest["files"]):
        return
    states = {}
    for rel, (sd, digest, metadata) in _state_dicts().items():
        _save_checkpoint(sd, digest, metadata, FIXTURES / rel)
        states[rel.split("/")[0]] = sd
    for fixture, images in manifest["images"].items():
        (FIXTURES / fixture / "images").mkdir(exist_ok=True)
        for name in images:
            shutil.copyfile(IMAGES / name, FIXTURES / fixture / "images" / name)
    for fixture in manifest["goldens"]:
        gdir = FIXTURES / fixture / "golden"
        gdir.mkdir(exist_ok=True)
        for packed in sorted((FIXTURES / fixture / "packed" / "golden").glob("*.npz")):
            arrays = _rebuild_golden(packed, states[fixture])
            buf = io.BytesIO()
            np.savez(buf, **arrays)
            _write(gdir / packed.name, buf.getvalue())
    packed = FIXTURES / "d2_lvis_tiny" / "packed" / "onnx"
    _rebuild_onnx(packed / "skeleton.onnx", packed / "residual.npz", states["d2_lvis_tiny"],
                  manifest["onnx_sha256"], FIXTURES / D2_ONNX)
    stamp.write_text(want)
