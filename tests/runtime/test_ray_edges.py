"""Ray's edges: an address where nothing listens (given, or in $RAY_ADDRESS) is refused in
seconds, so are workers asking for more than the cluster has, a worker's NorcalError reaches
the user as one line, and --ray never takes the input that follows it."""

import socket
import sys
import time
from pathlib import Path

import pytest

from norcal.cli import main
from norcal.core.contract import Preprocessing
from norcal.core.errors import NorcalError
from norcal.runtime.ray_inference import (RayOptions, ResultsFormat, check_cluster_address, check_reachable,
                                          run_images_ray, worker_error)

SYNTH_VAL = Path(__file__).parents[2] / "norcal" / "examples" / "d2_synth_trained" / "val"
IMAGE = sorted(SYNTH_VAL.glob("*.png"))[0]


@pytest.fixture
def closed_port():
    """A local port where nothing listens (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_address_is_refused_in_seconds(closed_port):
    t0 = time.perf_counter()
    with pytest.raises(NorcalError, match=rf"cannot reach the Ray cluster at 127\.0\.0\.1:{closed_port}: ") as e:
        check_reachable(f"127.0.0.1:{closed_port}")
    assert e.value.params == ("address",)
    with pytest.raises(NorcalError, match="cannot reach"):
        check_reachable(f"ray://127.0.0.1:{closed_port}")
    assert time.perf_counter() - t0 < 10
    with pytest.raises(NorcalError, match="address 'head-node': expected HOST:PORT"):
        check_reachable("head-node")
    check_reachable(None)
    check_reachable("auto")  # Ray's to resolve
    with socket.socket() as s:  # a port that accepts passes
        s.bind(("127.0.0.1", 0))
        s.listen()
        check_reachable(f"127.0.0.1:{s.getsockname()[1]}")


def test_ray_before_the_inputs_takes_no_value(closed_port, tmp_path, capsys):
    """`norcal infer --ray MODEL IMAGES`: MODEL stays the model; the address is its own flag,
    named in the error."""
    model = tmp_path / "m.onnx"
    model.write_bytes(b"not a model")
    rc = main(["infer", "--ray", str(model), str(IMAGE), "-o", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1 and "m.onnx" in err, err
    assert "--ray" not in err  # the input reached the model loader, not --ray
    rc = main(["infer", "--ray", str(model), str(IMAGE), "--ray-address", f"127.0.0.1:{closed_port}",
               "-o", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "m.onnx" in err or "--ray-address" in err, err
    assert not (tmp_path / "r.json").exists()


def test_help_says_ray_takes_no_value(capsys):
    assert main(["infer", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--ray-address ADDRESS" in out and "takes no value" in out


def _raises_norcal():
    raise NorcalError("x.png: a problem only the worker sees", param="batch_size")


def test_worker_norcal_error_is_one_line(local_ray):
    """Ray hands back a worker's NorcalError as RayTaskError(NorcalError), itself a
    NorcalError whose text is the remote traceback: it is unwrapped to the worker's line."""
    local_ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # tests/ is not on the workers' path
    with pytest.raises(Exception) as e:
        local_ray.get(local_ray.remote(_raises_norcal).remote())
    assert isinstance(e.value, NorcalError) and "\n" in str(e.value)  # what Ray raises
    err = worker_error(e.value, 3)
    assert str(err) == "a Ray worker: x.png: a problem only the worker sees"
    assert err.params == ("batch_size",)
    plain = NorcalError("here", param="p")
    assert worker_error(plain, 3) is plain


def test_run_images_ray_reports_a_worker_norcal_error_in_one_line(local_ray):
    """A NorcalError raised in a Ray Data task (here: a spec no image can be prepared with)
    leaves run_images_ray as one line, not Ray's remote traceback."""
    with pytest.raises(NorcalError) as e:
        list(run_images_ray(lambda: None, [IMAGE], [1], Preprocessing(800, 1333, "XYZ"),
                            ResultsFormat(None, False), 1, RayOptions()))
    assert "\n" not in str(e.value), str(e.value)
    assert "channel format must be BGR or RGB" in str(e.value)


def test_ray_address_from_the_environment_is_checked_too(tmp_path, capsys, monkeypatch):
    """RAY_ADDRESS (which Ray takes over no address and over "auto") is checked like
    --ray-address: refused in seconds, in one line naming RAY_ADDRESS, before any work."""
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # loopback, port 1: nothing listens
    for address in (None, "auto"):
        with pytest.raises(NorcalError, match=r"cannot reach the Ray cluster at 127\.0\.0\.1:1 \(from RAY_ADDRESS\)") as e:
            check_cluster_address(address)
        assert e.value.params == ()
    model = tmp_path / "m.onnx"
    model.write_bytes(b"not a model")
    for extra in ([], ["--ray-address", "auto"]):
        t0 = time.perf_counter()
        rc = main(["infer", "--ray", str(model), str(IMAGE), *extra, "-o", str(tmp_path / "r.json")])
        err = capsys.readouterr().err
        assert rc == 2 and len(err.splitlines()) == 1, err
        assert "RAY_ADDRESS" in err and "127.0.0.1:1" in err and "--ray-address" not in err, err
        assert time.perf_counter() - t0 < 30
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]


def test_workers_asking_for_more_than_the_cluster_has_are_refused(local_ray):
    """The local instance has 2 CPUs and no GPU: a worker asking for a GPU (or 3 CPUs) would
    never be scheduled; the run is refused in one line naming what each worker asks for."""
    for options, message in ((RayOptions(gpus_per_worker=1), "gpus_per_worker asks each Ray worker for a GPU; "
                                                              "the cluster has none"),
                             (RayOptions(cpus_per_worker=3), "cpus_per_worker asks each Ray worker for 3 CPUs; "
                                                             "the cluster has 2")):
        t0 = time.perf_counter()
        with pytest.raises(NorcalError) as e:
            list(run_images_ray(lambda: None, [IMAGE], [1], Preprocessing(800, 1333, "BGR"),
                                ResultsFormat(None, False), 1, options))
        assert str(e.value) == message
        assert time.perf_counter() - t0 < 30
