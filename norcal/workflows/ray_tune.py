"""Tune gamma on a Ray cluster: the network pass on a pool of workers, the re-scoring and the
evaluation distributed over the gammas.

The job is :func:`norcal.workflows.tune.tune`'s, cut the same way (the same chunks and network
batches, the same re-scoring batches), so the sweep is the same, number for number:

    driver: plan (GT, images, chunks, priors)                      as tune() plans it
    for each chunk of images:
        the workers (actors, one detector each): network batches -> the detector's caches, kept in
            Ray's object store (never on the driver)
        one call per gamma, spread over the workers: the chunk's caches -> detections
    one call per gamma, spread over the workers: its detections -> LVIS box AP (SweepPoint)

The workers do all the work, so nothing waits for CPUs that idle workers hold (tasks beside
the actors would, with every CPU reserved by an actor).

A worker that dies is replaced and its batch run again (``RayOptions.max_retries``); a batch
that still fails is a NorcalError naming its first image. Ray is imported only when called.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

from norcal.core.calibration.tables import CalibrationTable
from norcal.runtime.ray_inference import BatchFailed, RayOptions, ray_session, worker_error
from norcal.workflows.tune import TunePlan, plan_tune, progress_step
from norcal.workflows.tune_cache import cache_images, concat_caches, rescore_gamma
from norcal.workflows.tune_sweep import SweepPoint, TuneResult, evaluate_gamma


class _TuneWorker:
    """One detector (its family's PyTorch model, eval mode) on a Ray worker. It runs network
    batches into the detector's caches (:meth:`norcal.export.families.Detector.cache`), and re-scores and evaluates the gammas it is given: the pool
    does all the work, so nothing waits for CPUs that the workers hold."""

    def __init__(self, weights: str, config: str | None, threads: int | None, decoding=None, classifier=None):
        import torch

        from norcal.export.families import load_detector

        if threads:
            torch.set_num_threads(int(threads))
        self.detector = load_detector(weights, config, decoding, classifier)
        self.model = self.detector.model  # its PyTorch model, for code that inspects the worker

    def cache(self, pairs: list, batch_size: int, priors: list, mechanism: str):
        try:
            cache = cache_images(self.detector, pairs, priors, mechanism, batch_size)
        except Exception as e:  # noqa: BLE001 - retried by Ray, then reported by the driver
            more = f" (and {len(pairs) - 1} more images of its batch)" if len(pairs) > 1 else ""
            why = (str(e).splitlines() or [""])[0]
            raise BatchFailed(f"{pairs[0][1]}{more}: {type(e).__name__}: {why}") from None
        return cache, cache.nbytes

    def rescore(self, caches: list, index: int, prior, mechanism: str, batch_size: int,
                category_ids: list[int]):
        """The sweep's ``index``-th gamma over one chunk: the chunk's caches joined as tune()
        holds them, re-scored -> (Detections, seconds)."""
        import ray

        t0 = time.perf_counter()
        dets = rescore_gamma(self.detector, concat_caches(ray.get(caches)), index, prior, mechanism,
                             batch_size, category_ids)
        return dets, time.perf_counter() - t0

    def evaluate(self, gt, parts: list, gamma: float, topk: int, seconds: float, rules) -> SweepPoint:
        import ray

        return evaluate_gamma(gt, ray.get(parts), gamma, topk, seconds, rules=rules)


def tune_ray(weights: os.PathLike, gt: os.PathLike, images: os.PathLike | None, gammas: Sequence[float],
             table: str | os.PathLike | CalibrationTable | None = None, *, config: os.PathLike | None = None,
             factor: str = "cdt", mechanism: str = "exp", batch_size: int = 4,
             max_cache_bytes: int = 2 << 30,
             progress: Callable[[str, int, int], None] | None = None,
             min_count: float | None = None, options: RayOptions = RayOptions(),
             split: str = "val", rules: str = "auto",
             on_rules: Callable[[str], None] | None = None, decoding=None, classifier=None) -> TuneResult:
    """:func:`norcal.workflows.tune.tune` on Ray; the same arguments, plus ``options`` (where
    and how many workers; ``options.threads``: torch threads per worker; the detector runs on
    CPU, as in tune()). The weights, the config and the images must be readable at the same
    paths on every node."""
    options.check()
    plan = plan_tune(weights, gt, images, gammas, table, config=config, factor=factor,
                     mechanism=mechanism, batch_size=batch_size, max_cache_bytes=max_cache_bytes,
                     min_count=min_count, split=split, rules=rules,
                     decoding=decoding, classifier=classifier)
    if on_rules:
        on_rules(plan.rules.line)

    pairs = [(i, str(p)) for i, p in plan.pairs]
    gammas = plan.gammas
    net_step = progress_step(progress, "network pass", len(pairs))
    sweep_step = progress_step(progress, "re-scoring", len(pairs) * len(gammas))
    with ray_session(options) as ray:
        try:
            return _run(ray, plan, pairs, gammas, options, net_step, sweep_step,
                        progress_step(progress, "evaluation", len(gammas)))
        except Exception as e:  # noqa: BLE001 - Ray wraps a worker's error in its own types
            raise worker_error(e, options.max_retries) from None


def _run(ray, plan: TunePlan, pairs: list, gammas: list[float], options: RayOptions, net_step, sweep_step,
         eval_step) -> TuneResult:
    retries = options.max_retries
    worker = ray.remote(_TuneWorker).options(
        num_cpus=options.cpus_per_worker, num_gpus=options.gpus_per_worker or None,
        max_restarts=retries, max_task_retries=retries)
    workers = [worker.remote(str(plan.weights), None if plan.config is None else str(plan.config),
                             options.threads, plan.decoding, plan.classifier) for _ in range(options.num_workers)]
    turn = iter(range(1 << 62))  # round robin over the pool

    def call(method: str, *args, num_returns: int = 1):
        w = workers[next(turn) % len(workers)]
        return getattr(w, method).options(num_returns=num_returns,
                                          retry_exceptions=retries > 0).remote(*args)

    acc = plan.acc  # the sweep's priors, re-scoring batch and top K; its detections stay unused
    gt = ray.put(plan.gt)
    category_ids = plan.table.category_ids
    # per gamma, in chunk order: refs of the detections (kept in the object store) and seconds
    dets: list[list[Any]] = [[] for _ in gammas]
    secs: list[list[Any]] = [[] for _ in gammas]
    network, peak = 0.0, 0
    for s in range(0, len(pairs), plan.chunk):
        chunk = pairs[s:s + plan.chunk]
        t0 = time.perf_counter()
        batches = [chunk[b:b + plan.batch_size] for b in range(0, len(chunk), plan.batch_size)]
        calls = [call("cache", b, plan.batch_size, acc.priors, plan.mechanism, num_returns=2)
                 for b in batches]
        caches, sizes = [c for c, _ in calls], [n for _, n in calls]
        waiting = {n: len(b) for n, b in zip(sizes, batches)}
        while waiting:  # progress as batches finish, in whatever order
            done, _ = ray.wait(list(waiting), num_returns=1)
            net_step(waiting.pop(done[0]))
        network += time.perf_counter() - t0
        peak = max(peak, sum(ray.get(sizes)))
        for k, prior in enumerate(acc.priors):
            d, sec = call("rescore", caches, k, prior, plan.mechanism, acc.batch_size, category_ids,
                          num_returns=2)
            dets[k].append(d)
            secs[k].append(sec)
        pending = {sec[-1] for sec in secs}
        while pending:  # the chunk's caches are dropped once every gamma has re-scored them
            done, _ = ray.wait(list(pending), num_returns=1)
            pending.discard(done[0])
            sweep_step(len(chunk))
        del caches, calls
    points_refs = [call("evaluate", gt, d, g, acc.topk, sum(ray.get(sec)), plan.rules)
                   for d, g, sec in zip(dets, gammas, secs)]
    points = []
    for ref in points_refs:  # in gamma order
        points.append(ray.get(ref))
        eval_step()
    return TuneResult(points, plan.factor, plan.mechanism, plan.table.name, len(pairs), network, peak,
                      plan.min_count, acc.clamped, plan.iou_type, plan.gt_images, plan.rules.name,
                      plan.rules.reason)

