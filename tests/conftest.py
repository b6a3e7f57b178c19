from pathlib import Path

import pytest

import fixture_store
from norcal.examples import example_dir

FIXTURES = Path(__file__).parent / "fixtures"
TINY = FIXTURES / "d2_lvis_tiny"
# the bundled example (package data; its images drawn on first use), shared by the demo and the tests
SYNTH = example_dir()


def pytest_configure(config):
    """Rebuild the fixture files from their compact form before any test module is collected."""
    fixture_store.materialize()


@pytest.fixture
def tiny_dir() -> Path:
    return TINY


@pytest.fixture
def synth_dir() -> Path:
    return SYNTH


def assert_tensorrt_compatible(model) -> None:
    """Every model the tests export must pass the TensorRT ONNX-parser check."""
    from norcal.export.trt_check import check_model

    report = check_model(model)
    assert report.compatible, [f"{f.node} ({f.op_type}): {f.reason}" for f in report.errors]


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance for one test module: 2 CPUs, a small object store, no dashboard."""
    import ray

    ray.init(num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False)
    yield ray
    ray.shutdown()
