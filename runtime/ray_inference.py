"""Batch inference on a Ray cluster: Ray Data reads and prepares the batches, a pool of actors
(one runner each) runs them, and the driver gets each image's results back in input order.

The batches are planned on the driver (images ``[0:B]``, ``[B:2B]``, ... in input order, as
:func:`norcal.runtime.inference.run_images` forms them), so every image is padded and run
exactly as in a single process and the detections are the same, bit for bit on CPU. Each row
of the Ray dataset is one such batch:

    plan (driver)  ->  read + prepare (Ray Data tasks)  ->  runner actors (Ray Data actor pool)
                   ->  results JSON text per image  ->  driver: reorder, stream to the file

A worker that dies or raises is replaced and its batch retried (``RayOptions.max_retries``);
an image that cannot be decoded is not retried: it is reported (or skipped) by name.

Ray is an optional dependency (``pip install 'norcal-deploy[ray]'``); this module imports it
only when called.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from norcal.core.contract import Preprocessing
from norcal.core.errors import NorcalError, shown
from norcal.core.ranges import MAX_THREADS, check_range
from norcal.core.runner import Runner
from norcal.runtime.ray_cluster import (CONNECT_TIMEOUT_S, check_cluster_address, check_reachable,  # noqa: F401
                                        check_resources, handlers_kept, host_port)

INSTALL_HINT = "pip install 'norcal-deploy[ray]'"
# Ray Data hands a worker a whole block at a time: one planned batch per block spreads the
# batches over the pool and keeps finished batches close to input order; past this many
# blocks (a backfill of millions of images), blocks hold several batches
MAX_BLOCKS = 10_000


@dataclass(frozen=True)
class RayOptions:
    """Where and how wide to run.

    address: None joins the cluster in $RAY_ADDRESS or one started on this machine by
    ``ray start``, else starts a local Ray instance; "auto" joins such a cluster and fails
    without one; "host:6379" or "ray://host:10001" (Ray Client) a given one. When Ray is
    already initialised in this process, that instance is used as it is.
    num_workers: runner actors (each holds one model). gpus_per_worker / cpus_per_worker: the
    resources Ray reserves for each. threads: ONNX Runtime intra-op threads per worker.
    read_tasks: concurrent read-and-prepare tasks (they reserve no CPU: they would otherwise
    compete with the workers for the cores Ray hands out, and Ray Data's backpressure bounds
    how far they run ahead). max_retries: how often a batch whose worker raised or died is
    run again (on a new actor when it died) before the run fails.
    init_args: extra ``ray.init`` arguments for a local instance (``num_cpus``,
    ``object_store_memory``).
    """

    address: str | None = None
    num_workers: int = 1
    gpus_per_worker: float = 0.0
    cpus_per_worker: float = 1.0
    threads: int | None = 1
    read_tasks: int = 2
    max_retries: int = 3
    init_args: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        check_range("num_workers", self.num_workers, 1, 4096, integer=True)
        check_range("gpus_per_worker", self.gpus_per_worker, 0, 64)
        check_range("cpus_per_worker", self.cpus_per_worker, 0, MAX_THREADS)
        if self.threads is not None:
            check_range("threads", self.threads, 1, MAX_THREADS, integer=True)
        check_range("read_tasks", self.read_tasks, 1, 4096, integer=True)
        check_range("max_retries", self.max_retries, 0, 100, integer=True)
        if self.address not in (None, "auto"):
            host_port(self.address)


def require_ray():
    """The ``ray`` module with Ray Data, or a NorcalError saying how to install it."""
    try:
        import ray
        import ray.data  # noqa: F401 - Ray Data is a separate extra of ray
    except ImportError:
        raise NorcalError(f"running on Ray needs the optional package ray[data], which is not "
                          f"installed: {INSTALL_HINT}") from None
    return ray


@contextlib.contextmanager
def ray_session(options: RayOptions) -> Iterator[Any]:
    """Ray, initialised as ``options`` say for the duration (shut down after only if started
    here), once the cluster is known to answer and to have what each worker asks for; the
    process's signal handlers stay its own."""
    ray = require_ray()
    if ray.is_initialized():
        check_resources(ray, options.gpus_per_worker, options.cpus_per_worker)
        yield ray
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING,
                              "configure_logging": True}
    if options.address is None:
        kwargs.update(options.init_args)
    check_cluster_address(options.address)
    try:
        with handlers_kept():
            ray.init(address=options.address, **kwargs)
    except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError ...
        where = f"the Ray cluster at {options.address}" if options.address else "a local Ray instance"
        raise NorcalError(f"cannot start or reach {where}: {_first_line(e)}", param="address") from None
    try:
        check_resources(ray, options.gpus_per_worker, options.cpus_per_worker)
        yield ray
    finally:
        ray.shutdown()


@contextlib.contextmanager
def _quiet_data_context(max_retries: int):
    """Ray Data settings for one run: no progress bars of its own (the caller reports
    progress), application errors in the actors retried. Restored afterwards."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    saved = {k: getattr(ctx, k) for k in ("enable_progress_bars", "actor_task_retry_on_errors",
                                          "print_on_execution_start")
             if hasattr(ctx, k)}
    ctx.enable_progress_bars = False
    ctx.actor_task_retry_on_errors = max_retries > 0
    if hasattr(ctx, "print_on_execution_start"):
        ctx.print_on_execution_start = False
    log = logging.getLogger("ray.data")
    level = log.level
    log.setLevel(logging.ERROR)  # e.g. "progress bars disabled"
    try:
        yield ctx
    finally:
        for k, v in saved.items():
            setattr(ctx, k, v)
        log.setLevel(level)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


class BatchFailed(RuntimeError):
    """A worker could not run a batch; names its first image (what the driver reports)."""


# ----------------------------------------------------------------------------- the pipeline
# Functions and classes below run in Ray workers: module level, so they pickle by reference.

def _read_and_prepare(row: dict, spec: Preprocessing) -> dict:
    """One planned batch: read its images, prepare them as one model input batch. Images that
    cannot be decoded are listed in ``skipped`` (file, reason), not raised: a damaged file
    fails the same way on every retry."""
    from norcal.runtime.images import UNREADABLE, read_for_model, reason
    from norcal.runtime.inference import prepare

    paths, ids = list(row["paths"]), json.loads(row["ids"])
    arrays, kept_paths, kept_ids, skipped = [], [], [], []
    for p, i in zip(paths, ids):
        try:
            arrays.append(read_for_model(p, (spec.min_size, spec.max_size)))
        except UNREADABLE as e:
            skipped.append((p, reason(e)))
            continue
        kept_paths.append(p)
        kept_ids.append(i)
    if arrays:
        b = prepare(arrays, spec)
        images, sizes, originals = b.images, b.image_sizes, b.original_sizes
    else:
        images = np.zeros((0, 3, 1, 1), np.float32)
        sizes = originals = np.zeros((0, 2), np.int64)
    return {"batch": row["batch"], "paths": json.dumps(kept_paths), "ids": json.dumps(kept_ids),
            "skipped": json.dumps(skipped), "images": images, "image_sizes": sizes,
            "original_sizes": originals, "keep_empty_boxes": spec.rule.keeps_empty_boxes, "clip_boxes": bool(spec.clip_boxes),
            "mask_paste": spec.mask_paste}


@dataclass(frozen=True)
class ResultsFormat:
    """How detections become results JSON (:func:`norcal.runtime.results.detections_to_results`)."""

    category_ids: list[int] | None
    with_masks: bool = True


class _RunnerActor:
    """A Ray Data actor holding one runner: a prepared batch in, results JSON text per image out."""

    def __init__(self, make_runner: Callable[[], Runner], fmt: ResultsFormat):
        self.runner = make_runner()
        self.fmt = fmt

    def __call__(self, rows: dict[str, np.ndarray]) -> dict[str, list]:
        from norcal.runtime.preprocess import Batch
        from norcal.runtime.inference import detect
        from norcal.runtime.results import results_fragment

        out: dict[str, list] = {"batch": [], "paths": [], "texts": [], "counts": [], "skipped": []}
        for k in range(len(rows["batch"])):
            paths, ids = json.loads(rows["paths"][k]), json.loads(rows["ids"][k])
            texts, counts = [], []
            if paths:
                batch = Batch(np.asarray(rows["images"][k]), np.asarray(rows["image_sizes"][k]),
                              np.asarray(rows["original_sizes"][k]), bool(rows["keep_empty_boxes"][k]),
                              str(rows["mask_paste"][k]), bool(rows["clip_boxes"][k]))
                try:
                    dets = detect(self.runner, batch)
                    for i, det in zip(ids, dets):
                        text, n = results_fragment(i, det, self.fmt.category_ids, self.fmt.with_masks)
                        texts.append(text)
                        counts.append(n)
                except Exception as e:  # noqa: BLE001 - retried by Ray, then reported by the driver
                    more = f" (and {len(paths) - 1} more images of its batch)" if len(paths) > 1 else ""
                    raise BatchFailed(f"{paths[0]}{more}: {type(e).__name__}: {_first_line(e)}") from None
            out["batch"].append(int(rows["batch"][k]))
            out["paths"].append(json.dumps(paths))
            out["texts"].append(json.dumps(texts))
            out["counts"].append(json.dumps(counts))
            out["skipped"].append(rows["skipped"][k])
        return out


# ----------------------------------------------------------------------------- the driver

@dataclass
class ImageResults:
    """One image's results: its file, its detections as results-JSON text (the list's items,
    comma-separated; empty when none) and how many."""

    path: Path
    text: str
    count: int


def plan_batches(paths: Sequence[os.PathLike | str], image_ids: Sequence, batch_size: int) -> list[dict]:
    """Rows of the Ray dataset: batch k holds images [k*B, (k+1)*B) in input order."""
    if batch_size < 1:
        raise NorcalError(f"batch size must be >= 1, got {batch_size}", param="batch_size")
    if len(paths) != len(image_ids):
        raise NorcalError(f"{len(paths)} images but {len(image_ids)} image ids")
    return [{"batch": k, "paths": [str(p) for p in paths[s:s + batch_size]],
             "ids": json.dumps(list(image_ids[s:s + batch_size]))}
            for k, s in enumerate(range(0, len(paths), batch_size))]


def run_images_ray(make_runner: Callable[[], Runner], paths: Sequence[os.PathLike | str],
                   image_ids: Sequence, spec: Preprocessing, fmt: ResultsFormat, batch_size: int = 1,
                   options: RayOptions = RayOptions(), *,
                   failed: list[tuple[Path, str]] | None = None,
                   on_done: Callable[[int], None] | None = None) -> Iterator[ImageResults]:
    """Yield each image's results in input order, computed on Ray.

    make_runner: builds the runner inside each worker (picklable, e.g.
    ``functools.partial(open_runner, model, provider, threads)``); image_ids: one per path,
    JSON-serialisable (ints or strings). A file that cannot be decoded is a NorcalError
    naming it, or, when ``failed`` is a list, appended to it as (path, reason) and left out.
    ``on_done(n)``: n more input files finished. A batch that still fails after
    ``options.max_retries`` retries is a NorcalError naming its first image.
    """
    options.check()
    rows = plan_batches(paths, image_ids, batch_size)
    if not rows:
        return
    with ray_session(options) as ray, _quiet_data_context(options.max_retries):
        ds = ray.data.from_items(rows, override_num_blocks=min(len(rows), MAX_BLOCKS))
        ds = ds.map(_read_and_prepare, fn_kwargs={"spec": spec}, num_cpus=0,
                    compute=ray.data.TaskPoolStrategy(size=options.read_tasks))
        ds = _runner_pool(ray, ds, (make_runner, fmt), options)
        pending: dict[int, dict] = {}
        next_batch = 0
        try:
            for row in ds.iter_rows():
                pending[int(row["batch"])] = row
                while next_batch in pending:
                    yield from _emit(pending.pop(next_batch), failed, on_done)
                    next_batch += 1
        except Exception as e:  # noqa: BLE001 - Ray wraps the worker's error in its own types
            # (a worker's NorcalError arrives as RayTaskError(NorcalError), a NorcalError too)
            raise worker_error(e, options.max_retries) from None
    if next_batch != len(rows):  # Ray returned fewer batches than planned: never silently
        raise NorcalError(f"Ray returned {next_batch} of {len(rows)} batches")


def _runner_pool(ray, ds, constructor_args: tuple, options: RayOptions):
    """``ds`` through the pool of runner actors, one planned batch per call. Ray's defaults
    retry a dead actor's work forever; a bound makes a batch that always fails end the run."""
    import warnings

    with warnings.catch_warnings():
        # Ray 2.60 deprecates passing max_restarts / max_task_retries this way but names no
        # replacement for them yet
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        return ds.map_batches(
            _RunnerActor, fn_constructor_args=constructor_args, batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=options.num_workers),
            num_cpus=options.cpus_per_worker, num_gpus=options.gpus_per_worker or None,
            max_restarts=options.max_retries, max_task_retries=options.max_retries)


def _emit(row: dict, failed, on_done) -> Iterator[ImageResults]:
    from norcal.runtime.images import unreadable_error

    skipped = [(Path(p), why) for p, why in json.loads(row["skipped"])]
    if skipped and failed is None:
        raise unreadable_error(skipped[0][0], skipped[0][1])
    if failed is not None:
        failed.extend(skipped)
    paths, texts, counts = (json.loads(row[k]) for k in ("paths", "texts", "counts"))
    for p, text, n in zip(paths, texts, counts):
        yield ImageResults(Path(p), text, n)
    if on_done:
        on_done(len(paths) + len(skipped))


def worker_error(e: BaseException, retries: int) -> NorcalError:
    """Ray's wrapped exception -> one line: our BatchFailed (the batch's first image and the
    cause) or a NorcalError raised in a worker. Ray passes the worker's exception on as the
    text of its traceback (the exception object itself does not survive), so it is read there."""
    import re

    texts, seen, cause = [], set(), e
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if type(cause) is NorcalError:  # ours, raised on this machine or carried by Ray as it was
            return cause if cause is e else NorcalError(f"a Ray worker: {cause}", cause.params)
        texts.append(str(cause))
        cause = getattr(cause, "cause", None) or cause.__cause__
    text = "\n".join(texts)
    batch = re.search(rf"^{re.escape(BatchFailed.__module__)}\.BatchFailed: (.*)$", text, re.M)
    if batch:
        tries = f"after {retries} retr{'y' if retries == 1 else 'ies'}" if retries else "(no retries)"
        return NorcalError(f"a Ray worker failed on {batch.group(1)} {tries}", param="max_retries")
    ours = re.search(r"^norcal\.core\.errors\.NorcalError: (.*)$", text, re.M)
    if ours:  # e.g. a worker could not open the model
        return NorcalError(f"a Ray worker: {ours.group(1)}")
    return NorcalError(f"the Ray run failed: {type(e).__name__}: {shown(_first_line(e), 200)}")
