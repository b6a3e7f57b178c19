"""Outputs that would overwrite or hold the inputs, and runs stopped by SIGTERM / Ctrl-C.

An output folder may not be an input folder, hold an input, or lie inside an input folder,
and no output file may replace an image of an input folder, however the path is spelled
(symlink, ``..``). Each case runs the command in-process and checks: exit status 2, one line
on stderr naming the flag, and every file of the test's folder and of the shared inputs
byte-identical afterwards. The signal tests stop ``norcal infer`` (in subprocesses) at several
moments of its run, and a run in this process with SIGHUP.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TINY
from norcal.cli import main
from norcal.core.files import outputs
from test_hostile import GT, RESULTS, SENTINEL, _digest, world  # noqa: F401  (world: a fixture)


def _imgs(t: Path, n: int = 1) -> Path:
    """A folder of the test's own holding copies of the tiny model's first image."""
    d = t / "imgs"
    d.mkdir(exist_ok=True)
    for k in range(n):
        shutil.copy(TINY / "images" / "img0.png", d / f"img{k}.png")
    return d


def _eval_inputs(t: Path) -> Path:
    d = t / "data"
    d.mkdir()
    (d / "gt.json").write_text(json.dumps(GT))
    (d / "results.json").write_text(json.dumps(RESULTS))
    return d


def _link(t: Path, target: Path) -> Path:
    (t / "link").symlink_to(target, target_is_directory=True)
    return t / "link"


def _triton_input(w: Path, t: Path) -> Path:
    """A model read from a Triton repository: t/repo/o/1/model.onnx."""
    (t / "repo" / "o" / "1").mkdir(parents=True)
    shutil.copy(w / "cls.onnx", t / "repo" / "o" / "1" / "model.onnx")
    return t / "repo" / "o" / "1" / "model.onnx"


def _fake_data(t: Path) -> Path:
    d = t / "data"
    (d / "val").mkdir(parents=True)
    (d / "val.json").write_text(json.dumps(GT))
    shutil.copy(TINY / "images" / "img0.png", d / "val" / "img0.png")
    return d


def _infer(w, t, *extra):
    return ["infer", str(w / "tiny.onnx"), *extra, "-o", str(t / "r.json")]


# every case: (world, tmp) -> (argv, text the one error line must hold)
CASES = {
    # infer --draw
    "draw-is-input-folder": lambda w, t: (
        _infer(w, t, str(_imgs(t)), "--draw", str(t / "imgs")), "--draw"),
    "draw-is-input-folder-via-symlink": lambda w, t: (
        _infer(w, t, str(_imgs(t)), "--draw", str(_link(t, t / "imgs"))), "is the input folder"),
    "draw-is-input-folder-via-dotdot": lambda w, t: (
        _infer(w, t, str(_imgs(t)), "--draw", str(t / "imgs" / ".." / "imgs")), "is the input folder"),
    "draw-inside-input-folder": lambda w, t: (
        _infer(w, t, str(_imgs(t)), "--draw", str(t / "imgs" / "pictures")), "is inside the input folder"),
    "draw-holds-input-image": lambda w, t: (
        _infer(w, t, str(_imgs(t) / "img0.png"), "--draw", str(t / "imgs")), "holds the input"),
    "draw-holds-input-via-symlink": lambda w, t: (
        _infer(w, t, str(_imgs(t) / "img0.png"), "--draw", str(_link(t, t))), "holds the input"),
    "draw-holds-model": lambda w, t: (
        _infer(w, t, str(_imgs(t)), "--draw", str(w)), "holds the input"),
    "draw-is-a-file": lambda w, t: (
        (t / "pics").write_bytes(SENTINEL),
        _infer(w, t, str(_imgs(t)), "--draw", str(t / "pics")), "is a file")[1:],
    "draw-unwritable": lambda w, t: (
        _infer(w, t, str(_imgs(t)), "--draw", "/proc/norcal-draw"), "cannot write"),
    "infer-o-replaces-image-in-input-folder": lambda w, t: (
        ["infer", str(w / "tiny.onnx"), str(_imgs(t, 2)), "-o", str(t / "imgs" / "." / "img1.png")], "-o"),
    # demo --output
    "demo-output-is-data": lambda w, t: (
        ["demo", "--data", str(_fake_data(t)), "--output", str(t / "data")], "--output"),
    "demo-output-is-data-via-symlink": lambda w, t: (
        ["demo", "--data", str(_fake_data(t)), "--output", str(_link(t, t / "data"))], "is the input folder"),
    "demo-output-holds-data": lambda w, t: (
        ["demo", "--data", str(_fake_data(t)), "--output", str(t)], "holds the input"),
    "demo-output-inside-data": lambda w, t: (
        ["demo", "--data", str(_fake_data(t)), "--output", str(t / "data" / "val")],
        f"--output {t / 'data' / 'val'} is inside the input folder"),
    # export --triton-repo
    "export-triton-repo-holds-input": lambda w, t: (
        ["export", str(_triton_input(w, t)), "--gamma", "0.5", "--table", str(w / "two.json"),
         "-o", str(t / "o.onnx"), "--triton-repo", str(t / "repo"), "--force"], "--triton-repo"),
    "export-triton-repo-is-verify-folder": lambda w, t: (
        ["export", str(w / "model_final.pth"), "--classifier", "softmax", "--gamma", "0.5", "--verify", str(_imgs(t)),
         "-o", str(t / "o.onnx"), "--triton-repo", str(t / "imgs")],
        f"--triton-repo {t / 'imgs'} is the input folder"),
    # eval --plots
    "eval-plots-holds-gt": lambda w, t: (
        ["eval", "--gt", str(_eval_inputs(t) / "gt.json"), "--results", str(t / "data" / "results.json"),
         "--plots", str(t / "data")], "--plots"),
    "eval-plots-holds-gt-via-dotdot": lambda w, t: (
        ["eval", "--gt", str(_eval_inputs(t) / "gt.json"), "--results", str(t / "data" / "results.json"),
         "--plots", str(t / "data" / ".." / "data" / "..")], "holds the input"),
    "eval-plots-is-input-file": lambda w, t: (
        ["eval", "--gt", str(_eval_inputs(t) / "gt.json"), "--results", str(t / "data" / "results.json"),
         "--plots", str(t / "data" / "gt.json")], "--plots"),
    # the commands with file outputs only: no file may replace an image of an input folder
    "quantize-o-replaces-calibration-image": lambda w, t: (
        ["quantize", str(w / "tiny.onnx"), "--images", str(_imgs(t)), "-o", str(t / "imgs" / "img0.png")],
        "-o"),
    "tune-plot-replaces-image": lambda w, t: (
        ["tune", str(w / "model_final.pth"), "--config", str(w / "config.yaml"), "--gt", str(w / "gt.json"),
         "--images", str(_imgs(t)), "--plot", str(_link(t, t / "imgs") / "img0.png")], "--plot"),
    "parity-json-replaces-image": lambda w, t: (
        ["parity", str(w / "tiny.onnx"), str(_imgs(t)), "--checkpoint", str(w / "model_final.pth"),
         "--classifier", "softmax", "--json", str(t / "imgs" / "img0.png")], "--json"),
    "simulate-json-is-table-via-dotdot": lambda w, t: (
        ["simulate", "--table", str(w / "two.json"), "--json", str(w / ".." / w.name / "two.json")],
        "--json"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_touching_an_input_is_refused_before_any_work(name, world, tmp_path, capsys,  # noqa: F811
                                                             monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # rich must not wrap the error line
    argv, expected = CASES[name](world, tmp_path)
    before = _digest([tmp_path, world])
    capsys.readouterr()
    t0 = time.perf_counter()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert expected in lines[0], lines[0]
    assert _digest([tmp_path, world]) == before
    assert time.perf_counter() - t0 < 30  # refused up front, not after the work


def test_output_folder_beside_the_inputs_is_fine(world, tmp_path, capsys):  # noqa: F811
    """The rule is not too wide: a --draw folder next to the image folder, named like it."""
    imgs = _imgs(tmp_path)
    before = _digest([imgs])
    assert main(_infer(world, tmp_path, str(imgs), "--draw", str(tmp_path / "imgs-drawn"))) == 0, \
        capsys.readouterr().err
    assert [p.name for p in (tmp_path / "imgs-drawn").iterdir()] == ["img0.png"]
    assert _digest([imgs]) == before


# signal -> (exit status, the word of the CLI's last line)
STOPS = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated"), signal.SIGHUP: (129, "hung up")}


def _staged(out: Path) -> list[Path]:
    return [p for p in out.iterdir() if p.name.endswith(".tmp")]


def _loaded_onnxruntime(pid: int) -> bool:
    """ONNX Runtime's library is mapped: the command runs (the CLI imports it only there) and
    is opening the model, its results not yet staged."""
    try:
        return "onnxruntime_pybind11_state" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


# the moments of a run a signal lands at, each told from outside the process: (pid, out) -> due
MOMENTS = {
    "loading the model": lambda pid, out: _loaded_onnxruntime(pid) and not _staged(out),
    "results staged": lambda pid, out: bool(_staged(out)),
    "first results streamed": lambda pid, out: any(p.stat().st_size > 0 for p in _staged(out)),
    "several images in": lambda pid, out: any(p.stat().st_size > 1 << 20 for p in _staged(out)),
}



def _terminal_signals() -> None:
    """The child takes SIGINT and SIGHUP as a foreground command in a terminal does, even when
    the tests run in the background or under nohup (which ignore them, and children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.slow
def test_signal_at_any_moment_stops_the_run_and_writes_nothing(world, tmp_path):  # noqa: F811
    """norcal infer on many images, stopped by SIGINT, SIGTERM and SIGHUP at each moment of
    MOMENTS (the runs side by side, so the test takes one run's time): the exit status of the
    signal within 60 s, one line saying so, the earlier results untouched and no staged file
    left."""
    imgs = _imgs(tmp_path, 200)
    runs = {}
    cases = [(m, s) for m in MOMENTS for s in STOPS]
    for k, (moment, sig) in enumerate(cases):
        out = tmp_path / f"out{k}"
        out.mkdir()
        (out / "r.json").write_bytes(SENTINEL)
        proc = subprocess.Popen([sys.executable, "-m", "norcal", "infer", str(world / "tiny.onnx"), str(imgs),
                                 "--threads", "1", "-o", str(out / "r.json")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "COLUMNS": "400"}, preexec_fn=_terminal_signals)
        runs[(moment, sig)] = (proc, out, None)
    deadline = time.monotonic() + 240
    try:
        while any(sent is None for _, _, sent in runs.values()):
            assert time.monotonic() < deadline, "some runs never reached their moment"
            for (moment, sig), (proc, out, sent) in runs.items():
                if sent is not None:
                    continue
                assert proc.poll() is None, f"{sig.name} at {moment}: the run ended first ({proc.returncode})"
                if MOMENTS[moment](proc.pid, out):
                    proc.send_signal(sig)
                    runs[(moment, sig)] = (proc, out, time.monotonic())
            time.sleep(0.02)
        for (moment, sig), (proc, out, sent) in runs.items():
            case = f"{sig.name} at {moment}"
            try:
                _, err = proc.communicate(timeout=max(1.0, sent + 60 - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{case}: still running 60 s after the signal") from None
            status, word = STOPS[sig]
            assert proc.returncode == status, f"{case}: {err}"
            assert "Traceback" not in err, f"{case}: {err}"
            assert err.splitlines()[-1] == f"{word} (nothing was written)", f"{case}: {err}"
            assert sorted(p.name for p in out.iterdir()) == ["r.json"], case
            assert (out / "r.json").read_bytes() == SENTINEL, case
    finally:
        for proc, _, _ in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert len(list(imgs.iterdir())) == 200


def _mapped(pid: int, library: str) -> bool:
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


# moments while the CLI imports its commands and their libraries (a second or more, before any
# command runs), each told by the extension module the child maps: onnx, numpy, ctypes,
# pydantic, PyYAML, then onnxruntime (the command runs)
LOADING = ("onnx_cpp2py_export", "_multiarray_umath", "_ctypes", "_pydantic_core", "_yaml",
           "onnxruntime_pybind11_state")


# ``python -m norcal``, and what the console script runs (its entry point, norcal.__main__:main)
ENTRIES = (["-m", "norcal"], ["-c", "import sys; from norcal.__main__ import main; sys.exit(main())"])


# a KeyboardInterrupt raised where Python cannot pass it on (a __del__, a library's callback in
# its import) is printed as "Exception ignored" and lost: seen once at onnx's import, the run then
# went on to infer 200 images. The fake import below raises it there on purpose.
_LOST_INTERRUPT = """
import os, signal, sys, time

class Callback:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)  # the signal's handler runs here, inside __del__

class Finder:
    def find_spec(self, name, path=None, target=None):
        if name == "norcal.cli":
            Callback()  # dropped at once: __del__ runs
        return None

sys.meta_path.insert(0, Finder())
sys.argv = ["norcal", "--help"]
from norcal.__main__ import main
sys.exit(main())
"""


def test_sigint_where_python_would_lose_it_still_ends_the_load():
    proc = subprocess.run([sys.executable, "-c", _LOST_INTERRUPT], capture_output=True, text=True, timeout=120,
                          preexec_fn=_terminal_signals)
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, "interrupted (nothing was written)\n", "")


def test_sigint_while_the_cli_loads_ends_in_one_line(world, tmp_path):  # noqa: F811
    """Ctrl-C while ``norcal`` itself is still importing (the runs side by side, the moments
    shared between both entries): exit 130, the usual one line, no traceback, nothing written.
    200 images: the last moment's run must outlast a loaded machine's delay in sending the signal
    (a run that ended first is killed by it in Python's finalization, SIGINT back at its default)."""
    imgs = _imgs(tmp_path, 200)
    runs = []
    for k, library in enumerate(LOADING):
        out = tmp_path / f"out{k}"
        out.mkdir()
        (out / "r.json").write_bytes(SENTINEL)
        proc = subprocess.Popen([sys.executable, *ENTRIES[k % 2], "infer", str(world / "tiny.onnx"), str(imgs),
                                 "--threads", "1", "-o", str(out / "r.json")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_terminal_signals)
        runs.append((library, proc, out))
    try:
        pending, deadline = list(runs), time.monotonic() + 120
        while pending:
            assert time.monotonic() < deadline, f"never mapped: {[r[0] for r in pending]}"
            for run in list(pending):
                library, proc, _ = run
                assert proc.poll() is None, f"SIGINT at {library}: the run ended first ({proc.returncode})"
                if _mapped(proc.pid, library):
                    proc.send_signal(signal.SIGINT)
                    pending.remove(run)
            time.sleep(0.005)
        for library, proc, out in runs:
            _, err = proc.communicate(timeout=60)
            # 130, or (seen at onnx's import, about 1 run in 4 on a loaded machine, cause not found)
            # the interpreter ending itself by the signal after our line: a shell reports both as 130
            assert proc.returncode in (130, -signal.SIGINT) and "Traceback" not in err, f"SIGINT at {library}: {err}"
            assert err.splitlines()[-1] == "interrupted (nothing was written)", f"SIGINT at {library}: {err}"
            assert sorted(p.name for p in out.iterdir()) == ["r.json"] and (out / "r.json").read_bytes() == SENTINEL
    finally:
        for _, proc, _ in runs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def terminal_signals():
    """SIGINT and SIGHUP as a terminal's shell leaves them (a run started with nohup or in the
    background inherits them ignored, and an ignored signal stays ignored by design)."""
    old = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
           signal.SIGHUP: signal.signal(signal.SIGHUP, signal.SIG_DFL)}
    yield
    for sig, handler in old.items():
        signal.signal(sig, handler)


def test_a_sigint_lost_on_the_way_still_stops_the_commit(tmp_path, monkeypatch, capsys, terminal_signals):
    """A Ctrl-C whose KeyboardInterrupt a C extension swallowed (as one landing while
    onnxruntime creates its session can be): the run goes on to its end but does not commit;
    exit 130, nothing written."""
    out = tmp_path / "sim.json"
    out.write_bytes(SENTINEL)
    real = outputs.OutputRun.stage_file

    def stage_after_a_lost_sigint(self, dest):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)  # the handler runs here and its KeyboardInterrupt is lost
        except KeyboardInterrupt:
            pass
        return real(self, dest)

    monkeypatch.setattr(outputs.OutputRun, "stage_file", stage_after_a_lost_sigint)
    rc = main(["simulate", "--images", "2", "--train-images", "2", "--json", str(out)])
    err = capsys.readouterr().err
    assert rc == 130, err
    assert err.splitlines()[-1] == "interrupted (nothing was written)"
    assert [p.name for p in tmp_path.iterdir()] == ["sim.json"] and out.read_bytes() == SENTINEL


def test_sighup_stops_a_run_like_sigterm(tmp_path, monkeypatch, capsys, terminal_signals):
    """SIGHUP (the terminal closed) mid-run: exit 129, one line, nothing written, no staged
    file; the CLI's handler is removed afterwards."""
    out = tmp_path / "sim.json"
    out.write_bytes(SENTINEL)
    real = outputs.OutputRun.stage_file

    def stage_then_hang_up(self, dest):
        tmp = real(self, dest)
        os.kill(os.getpid(), signal.SIGHUP)
        return tmp

    monkeypatch.setattr(outputs.OutputRun, "stage_file", stage_then_hang_up)
    before = signal.getsignal(signal.SIGHUP)
    rc = main(["simulate", "--images", "2", "--train-images", "2", "--json", str(out)])
    err = capsys.readouterr().err
    assert rc == 129, err
    assert err.splitlines() == ["hung up (nothing was written)"]
    assert [p.name for p in tmp_path.iterdir()] == ["sim.json"] and out.read_bytes() == SENTINEL
    assert signal.getsignal(signal.SIGHUP) is before


def test_an_ignored_sighup_stays_ignored(tmp_path, capsys):
    """Under nohup SIGHUP is ignored: the run goes on and writes its outputs."""
    out = tmp_path / "sim.json"
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        real = outputs.OutputRun.stage_file
        with pytest.MonkeyPatch.context() as m:
            m.setattr(outputs.OutputRun, "stage_file",
                      lambda self, dest: (os.kill(os.getpid(), signal.SIGHUP), real(self, dest))[1])
            rc = main(["simulate", "--images", "2", "--train-images", "2", "--json", str(out)])
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, old)
    assert rc == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["gammas"]


def test_sigterm_after_the_outputs_are_in_place_says_so(tmp_path, monkeypatch, capsys):
    """A SIGTERM that arrives once every output is in place (the old ones being deleted) is
    delivered after the commit: exit 143, the new outputs, no set-aside copy, and a line that
    does not claim nothing was written. The CLI's SIGTERM handler is removed afterwards."""
    out = tmp_path / "sim.json"
    out.write_bytes(SENTINEL)
    real = outputs._remove

    def remove_then_signal(path):
        if path.name.endswith(".old") and path.exists():
            os.kill(os.getpid(), signal.SIGTERM)
        real(path)

    monkeypatch.setattr(outputs, "_remove", remove_then_signal)
    before = signal.getsignal(signal.SIGTERM)
    rc = main(["simulate", "--images", "2", "--train-images", "2", "--json", str(out)])
    err = capsys.readouterr().err
    assert rc == 143, err
    assert err.splitlines() == ["terminated (the outputs were written)"]
    assert json.loads(out.read_text())["gammas"] and [p.name for p in tmp_path.iterdir()] == ["sim.json"]
    assert signal.getsignal(signal.SIGTERM) is before


def test_library_refuses_outputs_over_its_inputs(world, tmp_path):  # noqa: F811
    """The library keeps the rule too, naming its parameters: a Triton repository holding the
    exported model (with force it would replace the model's folder) and a demo output that
    is its data folder."""
    from norcal import NorCal, export_onnx_file
    from norcal.core.errors import NorcalError
    from norcal.workflows.demo import run_demo

    src = _triton_input(world, tmp_path)
    data = _fake_data(tmp_path)
    before = _digest([tmp_path])
    with pytest.raises(NorcalError, match="triton_repo .* holds the input") as e:
        export_onnx_file(src, tmp_path / "o.onnx", NorCal(gamma=0.5, table=str(world / "two.json")),
                         triton_repo=tmp_path / "repo", force=True)
    assert e.value.params == ("triton_repo",)
    with pytest.raises(NorcalError, match="output_dir .* is the input folder") as e:
        run_demo(data, data)
    assert e.value.params == ("output_dir",)
    assert _digest([tmp_path]) == before
