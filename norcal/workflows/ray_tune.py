"""Tune gamma on a Ray cluster: the network pass on a pool of workers, the re-scoring and the
evaluation distributed over the gammas.

The job is :func:`norcal.workflows.tune.tune`'s, cut the same way (the same chunks and network
batches, the same re-scoring batches), so the sweep is the same, number for number:

    driver: plan (GT, images, chunks, priors)                      as tune() plans it
    for each chunk of images:
        the workers (actors, one detector each): network batches -> HeadCaches, kept in
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

from norcal.core.errors import NorcalError
from norcal.core.tables import CalibrationTable
from norcal.runtime.ray_inference import BatchFailed, RayOptions, ray_session, worker_error
from norcal.workflows.tune import (HeadCache, SweepPoint, TuneResult, cache_head_outputs,
                                   rescore, to_eval_detections)


class _TuneWorker:
    """One detector (our PyTorch model, eval mode) on a Ray worker. It runs network batches
    into :class:`HeadCache` s, and re-scores and evaluates the gammas it is given: the pool
    does all the work, so nothing waits for CPUs that the workers hold."""

    def __init__(self, weights: str, config: str | None, threads: int | None):
        import torch

        from norcal.export.detector import load_detector

        if threads:
            torch.set_num_threads(int(threads))
        self.spec, self.model = load_detector(weights, config)

    def cache(self, pairs: list, batch_size: int) -> tuple[HeadCache, int]:
        try:
            cache = cache_head_outputs(self.model, self.spec, pairs, batch_size)
        except Exception as e:  # noqa: BLE001 - retried by Ray, then reported by the driver
            more = f" (and {len(pairs) - 1} more images of its batch)" if len(pairs) > 1 else ""
            raise BatchFailed(f"{pairs[0][1]}{more}: {type(e).__name__}: {e}") from None
        return cache, cache.nbytes

    def rescore(self, caches: list, prior, mechanism: str, batch_size: int, category_ids: list[int]):
        """One gamma over one chunk: the chunk's caches joined as tune() holds them, re-scored
        -> (Detections, seconds)."""
        import ray

        t0 = time.perf_counter()
        cache = concat_caches(ray.get(caches))
        dets = rescore(self.model.roi_heads.box_predictor, cache, prior, mechanism, batch_size)
        return to_eval_detections(cache.image_ids, dets, category_ids), time.perf_counter() - t0

    def evaluate(self, gt, parts: list, gamma: float, topk: int, seconds: float) -> SweepPoint:
        import ray

        return evaluate_gamma(gt, ray.get(parts), gamma, topk, seconds)


def tune_ray(weights: os.PathLike, gt: os.PathLike, images: os.PathLike, gammas: Sequence[float],
             table: str | os.PathLike | CalibrationTable | None = None, *, config: os.PathLike | None = None,
             factor: str = "cdt", mechanism: str = "exp", batch_size: int = 4,
             max_cache_bytes: int = 2 << 30,
             progress: Callable[[str, int, int], None] | None = None,
             min_count: float | None = None, options: RayOptions = RayOptions()) -> TuneResult:
    """:func:`norcal.workflows.tune.tune` on Ray; the same arguments, plus ``options`` (where
    and how many workers; ``options.threads``: torch threads per worker). The weights, the
    config and the images must be readable at the same paths on every node."""
    options.check()
    plan = plan_tune(weights, gt, images, gammas, table, config=config, factor=factor,
                     mechanism=mechanism, batch_size=batch_size, max_cache_bytes=max_cache_bytes,
                     min_count=min_count)

    def bar(stage, total):
        if progress is None:
            return lambda n=1: None
        return lambda n=1: progress(stage, n, total)

    pairs = [(i, str(p)) for i, p in plan.pairs]
    gammas = plan.gammas
    net_step = bar("network pass", len(pairs))
    sweep_step = bar("re-scoring", len(pairs) * len(gammas))
    with ray_session(options) as ray:
        try:
            return _run(ray, plan, pairs, gammas, options, net_step, sweep_step,
                        bar("evaluation", len(gammas)))
        except NorcalError:
            raise
        except Exception as e:  # noqa: BLE001 - Ray wraps a worker's error in its own types
            raise worker_error(e, options.max_retries) from None


def _run(ray, plan, pairs, gammas, options: RayOptions, net_step, sweep_step, eval_step) -> TuneResult:
    retries = options.max_retries
    worker = ray.remote(_TuneWorker).options(
        num_cpus=options.cpus_per_worker, num_gpus=options.gpus_per_worker or None,
        max_restarts=retries, max_task_retries=retries)
    workers = [worker.remote(str(plan.weights), None if plan.config is None else str(plan.config),
                             options.threads) for _ in range(options.num_workers)]
    turn = iter(range(1 << 62))  # round robin over the pool

    def call(method: str, *args, num_returns: int = 1):
        w = workers[next(turn) % len(workers)]
        return getattr(w, method).options(num_returns=num_returns, retry_exceptions=retries > 0).remote(*args)

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
        calls = [call("cache", b, plan.batch_size, num_returns=2) for b in batches]
        caches, sizes = [c for c, _ in calls], [n for _, n in calls]
        waiting = {n: len(b) for n, b in zip(sizes, batches)}
        while waiting:  # progress as batches finish, in whatever order
            done, _ = ray.wait(list(waiting), num_returns=1)
            net_step(waiting.pop(done[0]))
        network += time.perf_counter() - t0
        peak = max(peak, sum(ray.get(sizes)))
        for k, prior in enumerate(plan.priors):
            d, sec = call("rescore", caches, prior, plan.mechanism, plan.rescore_batch, category_ids,
                          num_returns=2)
            dets[k].append(d)
            secs[k].append(sec)
        pending = {sec[-1] for sec in secs}
        while pending:  # the chunk's caches are dropped once every gamma has re-scored them
            done, _ = ray.wait(list(pending), num_returns=1)
            pending.discard(done[0])
            sweep_step(len(chunk))
        del caches, calls
    points_refs = [call("evaluate", gt, d, g, plan.topk, sum(ray.get(sec)))
                   for d, g, sec in zip(dets, gammas, secs)]
    points = []
    for ref in points_refs:  # in gamma order
        points.append(ray.get(ref))
        eval_step()
    return TuneResult(points, plan.factor, plan.mechanism, plan.table.name, len(pairs), network, peak,
                      plan.min_count, plan.clamped)


# ----------------------------------------------------------------------------- TEMPORARY: to move into tune.py

from dataclasses import dataclass as _dc
import math as _math
import numpy as _np


@_dc
class TunePlan:
    weights: Any
    config: Any
    gammas: list
    factor: str
    mechanism: str
    table: Any
    pairs: list
    spec: Any
    model: Any
    gt: Any
    chunk: int
    batch_size: int
    rescore_batch: int
    priors: list
    clamped: int
    min_count: Any

    @property
    def predictor(self):
        return self.model.roi_heads.box_predictor

    @property
    def topk(self):
        from norcal.workflows.tune import final_predictor
        return final_predictor(self.predictor).topk


def plan_tune(weights, gt, images, gammas, table=None, *, config=None, factor="cdt", mechanism="exp",
              batch_size=4, max_cache_bytes=2 << 30, min_count=None):
    from norcal.core.calibration import check_gamma
    from norcal.core.fileio import read_json
    from norcal.core.schemas import GROUND_TRUTH
    from norcal.evaluation import prepare_gt
    from norcal.evaluation.ground_truth import check_table_matches
    from norcal.export.detector import load_detector
    from norcal.export.spec import RETINANET
    from norcal.runtime.images import unreadable_files
    from norcal.workflows.tune import _priors, estimate_cache_bytes, images_from_gt, resolve_table

    gammas = [check_gamma(g, factor) for g in gammas]
    if table is not None:
        table = resolve_table(table)
    gt_data = read_json(gt, "GT", GROUND_TRUTH)
    pairs = images_from_gt(gt_data, images, str(gt))
    unreadable_files([p for _, p in pairs], skippable=False)
    spec, model = load_detector(weights, config)
    prepared = prepare_gt(gt_data, table, where=str(gt))
    check_table_matches(table, prepared)
    per_image = estimate_cache_bytes(spec, 1)
    chunk = max(1, int(max_cache_bytes // per_image))
    chunk -= chunk % batch_size
    priors, clamped = _priors(table, gammas, factor, min_count)
    return TunePlan(weights, config, [float(g) for g in gammas], factor, mechanism, table, pairs, spec, model,
                    prepared, chunk, batch_size, max(batch_size, 8), priors, clamped, min_count)


def concat_caches(parts):
    import torch
    from norcal.workflows.tune import _pad_to

    p = max(c.proposals.shape[1] for c in parts)
    cat = lambda name, fill: torch.cat([_pad_to(getattr(c, name), p, fill) for c in parts])  # noqa: E731
    return HeadCache(image_ids=[i for c in parts for i in c.image_ids], proposals=cat("proposals", 0),
                     valid=cat("valid", False), cls_logits=cat("cls_logits", 0), box_deltas=cat("box_deltas", 0),
                     image_sizes=_np.concatenate([c.image_sizes for c in parts]),
                     original_sizes=_np.concatenate([c.original_sizes for c in parts]))


def evaluate_gamma(gt, parts, gamma, topk, seconds=0.0):
    from norcal.evaluation import evaluate
    from norcal.workflows.tune import _concat

    t0 = time.perf_counter()
    ev = _concat(parts)
    if len(ev) == 0:
        raise NorcalError(f"gamma {gamma:g}: no detections on any image")
    res = evaluate(gt, ev, "bbox", topk)
    return SweepPoint(gamma, dict(res.stats), len(ev), seconds + time.perf_counter() - t0)
