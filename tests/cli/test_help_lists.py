"""Help texts list what the product accepts, from the registries: the detector families
(norcal.export.families.FAMILIES) and the calibration table sources (norcal.core.calibration.tables)."""

import argparse
import re

import pytest

from norcal.cli import build_parser
from norcal.export.families import FAMILIES

# the families and built-in tables this checkout ships, written out by hand
SHIPPED_FAMILIES = ("detectron2", "foreign", "torchvision", "ultralytics")
SHIPPED_TABLES = ("lvis_v0_5", "lvis_v1")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_export_help_lists_every_family_and_what_it_reads():
    assert sorted(f.name for f in FAMILIES) == list(SHIPPED_FAMILIES)
    text = flat(subcommands()["export"].format_help())
    for family in FAMILIES:
        assert family.reads, family.name
        assert f"- {family.name}: {flat(family.reads)}" in text
    for name in ("YOLO26", "RT-DETR", "torchvision", "ViTDet"):
        assert name in text, name


@pytest.mark.parametrize("command, flag", [("export", "model"), ("tune", "model"), ("parity", "--checkpoint")])
def test_checkpoint_helps_name_every_checkpoint_family(command, flag):
    action = next(a for a in subcommands()[command]._actions if flag in a.option_strings or a.dest == flag)
    for name in ("detectron2", "torchvision", "ultralytics"):
        assert name in action.help, (command, name)
    assert "foreign" not in action.help  # it reads no checkpoint


def test_every_table_flag_lists_every_source():
    helps = {name: a.help for name, p in subcommands().items() for a in p._actions if "--table" in a.option_strings}
    assert {"export", "tune", "eval", "infer", "simulate"} <= set(helps)
    for name, text in helps.items():
        for source in (*SHIPPED_TABLES, "JSON of class counts", "COCO/LVIS training annotations", "data.yaml"):
            assert source in text, (name, source)


def test_every_help_formats():
    """argparse formats each help (no stray % in a generated text)."""
    for name, parser in subcommands().items():
        parser.format_help()


def provider_choices_of(command: str) -> tuple:
    return tuple(next(a for a in subcommands()[command]._actions if "--provider" in a.option_strings).choices)


def test_provider_choices_are_the_backends():
    """ONNX Runtime's providers (auto, cpu, cuda, tensorrt) and the TensorRT engine's, as the backends
    take them; a provider a backend gains is offered without a CLI change."""
    import dataclasses

    from norcal.runtime import backends

    assert provider_choices_of("infer") == ("auto", "cpu", "cuda", "tensorrt")
    assert provider_choices_of("parity") == ("auto", "cpu", "cuda", "tensorrt")
    ort = backends.ONNXRUNTIME
    wider = dataclasses.replace(ort, providers=(*ort.providers, "rocm"))
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(backends, "BACKENDS", [wider, backends.TENSORRT])
        mp.setattr(backends, "ONNXRUNTIME", wider)
        assert provider_choices_of("infer")[-1] == "rocm" and provider_choices_of("parity")[-1] == "rocm"
    finally:
        mp.undo()
