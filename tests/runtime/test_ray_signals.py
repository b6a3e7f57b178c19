"""ray.init sets its own SIGTERM handler (exit 15 with a stack dump): a run on Ray keeps the
process's handlers, so the CLI's SIGTERM / SIGHUP still stop it with its own message."""

import signal

import pytest

from norcal.runtime.ray_inference import RayOptions, ray_session


class Mine(Exception):
    pass


def test_ray_session_keeps_the_signal_handlers():
    import ray

    if ray.is_initialized():
        pytest.fail("Ray is already running in this process: the test needs to start it")

    def mine(_signum, _frame):
        raise Mine

    old = {sig: signal.signal(sig, mine) for sig in (signal.SIGTERM, signal.SIGHUP)}
    # as a terminal's shell leaves it (a background run inherits SIGINT ignored)
    old[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with ray_session(RayOptions(init_args={"num_cpus": 1, "object_store_memory": 100 * 2**20})):
            assert ray.is_initialized()
            assert signal.getsignal(signal.SIGTERM) is mine and signal.getsignal(signal.SIGHUP) is mine
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    assert not ray.is_initialized()
