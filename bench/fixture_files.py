"""The test fixtures the bench scripts run on, rebuilt from their compact form first
(tests/fixture_store.py)."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"


def fixture_dir(name: str) -> Path:
    """tests/fixtures/NAME with every file in place."""
    sys.path.insert(0, str(TESTS))
    import fixture_store

    fixture_store.materialize()
    return TESTS / "fixtures" / name
