"""An output that is an input by another name: a hard link (the same inode, another path) is
refused as a symlink or the same path is, by check_apart and by the library's quantize_model."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from norcal.core.errors import NorcalError
from norcal.core.files.outputs import check_apart


def test_an_output_hard_linked_to_an_input_file_is_refused(tmp_path):
    src = tmp_path / "in" / "model.onnx"
    src.parent.mkdir()
    src.write_bytes(b"input")
    link = tmp_path / "out.onnx"
    os.link(src, link)
    assert link.resolve() != src.resolve()  # no path resolution finds it: only the inode does
    with pytest.raises(NorcalError) as e:
        check_apart([src], files={"output": link})
    assert str(e.value) == (f"output {link} is the input file {src}; choose another (inputs are never "
                            "modified)") and e.value.param == "output"
    other = tmp_path / "copy.onnx"
    other.write_bytes(b"input")  # the same bytes, another file: allowed
    check_apart([src], files={"output": other})


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
def test_quantize_model_refuses_its_input_as_output(tmp_path, how):
    import norcal

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))
    from test_infer import build_contract_model

    model = build_contract_model(tmp_path / "model.onnx")
    before = model.read_bytes()
    out = {"same": model, "symlink": tmp_path / "s.onnx", "hardlink": tmp_path / "h.onnx"}[how]
    if how == "symlink":
        out.symlink_to(model)
    elif how == "hardlink":
        os.link(model, out)
    with pytest.raises(NorcalError) as e:
        norcal.quantize_model(norcal.QuantizeOptions(model=model, output=out, precision="fp16"))
    assert str(e.value) == f"output {out} is the input model; choose another (inputs are never modified)"
    assert e.value.param == "output" and model.read_bytes() == before
