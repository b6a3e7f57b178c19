from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
TINY = FIXTURES / "d2_lvis_tiny"
SYNTH = FIXTURES / "d2_synth_trained"


@pytest.fixture
def tiny_dir() -> Path:
    return TINY


@pytest.fixture
def synth_dir() -> Path:
    return SYNTH
