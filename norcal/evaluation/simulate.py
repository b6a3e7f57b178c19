"""An LVIS-scale simulated benchmark: NorCal on a synthetic long-tailed detector.

The classes are LVIS v1's 1203 categories with their real training image counts N_c. A
validation GT in LVIS format (federated: positives, ``neg_category_ids``,
``not_exhaustive_category_ids``) is drawn so frequent classes appear more often. A detector
simulator gives every image R proposals with logits [R, C+1] whose foreground logits carry
the long-tail bias of a real LVIS model, ``bias * (log N_c - mean log N)``, so the plain
softmax under-scores rare classes. For each gamma the logits go through
:func:`norcal.core.calibration.formula.calibrate`, then LVIS's score threshold (1e-4) and top-300 per
image, then :func:`norcal.evaluation.evaluate`. Gamma is picked on a "train" split (other
images, other seed) and checked on "val". (No NMS: each proposal carries one box, so
duplicates are rare by construction.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from norcal.core.calibration.formula import calibrate, log_prior
from norcal.core.errors import NorcalError
from norcal.core.ranges import check_range
from norcal.evaluation.detections import Detections
from norcal.evaluation.ground_truth import LvisGT, prepare_gt
from norcal.evaluation.lvis_eval import evaluate

HEIGHT, WIDTH = 480, 640
SCORE_THRESH = 1e-4


@dataclass
class SimConfig:
    """Knobs of the simulation (defaults give a baseline resembling a real LVIS model)."""

    images: int = 2000  # validation images
    train_images: int = 1000  # images of the split gamma is picked on
    seed: int = 0
    proposals: int = 64  # R per image
    bias: float = 1.0  # long-tail logit bias per unit of log N_c
    signal: float = 5.0  # mean logit boost of the object's own class
    positive_power: float = 0.5  # P(class annotated in an image) ~ N_c ** power
    max_dets: int = 300
    batch: int = 32  # images per vectorised batch


@dataclass
class SimSplit:
    """One split: its GT (dict and prepared) and the detector's per-image state."""

    gt: dict
    prepared: LvisGT
    boxes: np.ndarray  # [I, R, 4] proposal boxes (x, y, w, h)
    labels: np.ndarray  # [I, R] class index of the proposal's object, -1 for background
    seed: int


@dataclass
class SimReport:
    gammas: list[float]
    val: list[dict[str, float]]
    train: list[dict[str, float]]
    gamma_train: float  # picked on train (best AP)
    gamma_val: float  # best on val (the oracle)
    config: SimConfig

    def to_json(self) -> dict:
        return {"gammas": self.gammas, "val": self.val, "train": self.train,
                "gamma_picked_on_train": self.gamma_train, "gamma_best_on_val": self.gamma_val,
                "picked_is_best_on_val": self.gamma_train == self.gamma_val,
                "config": self.config.__dict__}


def simulate_gt(table, images: int, seed: int, positive_power: float = 0.5,
                max_instances: int = 24) -> dict:
    """An LVIS-format GT over ``table``'s categories: rectangles, federated fields."""
    if images < 1:
        raise NorcalError(f"images must be >= 1, got {images}", param="images")
    rng = np.random.default_rng(seed)
    counts = table.counts("image")
    c_n = len(counts)
    p = counts ** positive_power
    p /= p.sum()
    ids = np.asarray(table.category_ids)
    imgs, anns = [], []
    for i in range(images):
        iid = 1 + i  # make_split maps image id i + 1 to row i
        k = min(1 + rng.poisson(2.0), 8, c_n)  # a small --table has fewer classes
        pos = rng.choice(c_n, size=k, replace=False, p=p)
        n_inst = np.minimum(rng.geometric(0.55, size=k), 6)
        while n_inst.sum() > max_instances:
            n_inst[np.argmax(n_inst)] -= 1
        # negatives: verified-absent classes, drawn like positives (frequent ones more)
        neg = rng.choice(c_n, size=min(12, c_n), replace=False, p=p)
        neg = [int(ids[c]) for c in neg if c not in pos][:8]
        nel = [int(ids[c]) for c in pos if rng.random() < 0.1]
        imgs.append({"id": iid, "height": HEIGHT, "width": WIDTH, "neg_category_ids": neg,
                     "not_exhaustive_category_ids": nel})
        for c, m in zip(pos, n_inst):
            for _ in range(int(m)):
                side = np.exp(rng.uniform(np.log(12), np.log(320)))
                ar = np.exp(rng.normal(0, 0.3))
                w, h = min(side * ar, WIDTH - 1), min(side / ar, HEIGHT - 1)
                x, y = rng.uniform(0, WIDTH - w), rng.uniform(0, HEIGHT - h)
                anns.append({"id": len(anns) + 1, "image_id": iid, "category_id": int(ids[c]),
                             "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0,
                             "segmentation": [[x, y, x + w, y, x + w, y + h, x, y + h]]})
    cats = [{"id": int(c["id"]), "name": c["name"], "frequency": c["frequency"],
             "image_count": int(c["image_count"])} for c in table.categories]
    return {"images": imgs, "annotations": anns, "categories": cats}


def _jitter(box: np.ndarray, rng, scale: float) -> np.ndarray:
    x, y, w, h = box
    dx, dy = rng.normal(0, scale, 2) * (w, h)
    sw, sh = np.exp(rng.normal(0, scale, 2))
    nw, nh = w * sw, h * sh
    nx = np.clip(x + dx, 0, WIDTH - 1)
    ny = np.clip(y + dy, 0, HEIGHT - 1)
    return np.array([nx, ny, max(min(nw, WIDTH - nx), 1.0), max(min(nh, HEIGHT - ny), 1.0)])


def make_split(table, images: int, seed: int, config: SimConfig) -> SimSplit:
    """GT plus the simulator's proposals: two per object (a good and a loose one), the rest background."""
    r = config.proposals
    gt = simulate_gt(table, images, seed, config.positive_power, max_instances=(r - 8) // 2)
    prepared = prepare_gt(gt)
    rng = np.random.default_rng(seed + 7919)
    boxes = np.zeros((images, r, 4))
    labels = -np.ones((images, r), dtype=np.int64)
    cat_index = {int(c): i for i, c in enumerate(table.category_ids)}
    per_image: dict[int, list] = {}
    for a in gt["annotations"]:
        per_image.setdefault(a["image_id"] - 1, []).append(a)
    for i in range(images):
        j = 0
        for a in per_image.get(i, []):
            for scale in (0.1, 0.25):
                boxes[i, j] = _jitter(np.asarray(a["bbox"]), rng, scale)
                labels[i, j] = cat_index[a["category_id"]]
                j += 1
        for jj in range(j, r):
            w, h = np.exp(rng.uniform(np.log(10), np.log(300), 2))
            w, h = min(w, WIDTH - 1), min(h, HEIGHT - 1)
            boxes[i, jj] = [rng.uniform(0, WIDTH - w), rng.uniform(0, HEIGHT - h), w, h]
    return SimSplit(gt=gt, prepared=prepared, boxes=boxes, labels=labels, seed=seed)


def proposal_logits(split: SimSplit, lo: int, hi: int, log_counts: np.ndarray, bias: float,
                    signal: float = 5.0) -> np.ndarray:
    """Logits [hi-lo, R, C+1] (background last) for images lo..hi-1, deterministic per batch."""
    rng = np.random.default_rng([split.seed, lo])
    labels = split.labels[lo:hi]
    b, r = labels.shape
    c_n = len(log_counts)
    phi = rng.standard_normal((b, r, c_n + 1), dtype=np.float32)
    phi[..., :c_n] += (bias * (log_counts - log_counts.mean())).astype(np.float32)
    phi[..., :c_n] -= 3.0
    fg = labels >= 0
    bi, ri = np.nonzero(fg)
    y = labels[bi, ri]
    # the object's class gets a signal; a fixed "look-alike" class a weaker one
    phi[bi, ri, y] += rng.normal(signal, 2.0, size=y.size).astype(np.float32)
    confuse = (y * 7919 + 13) % c_n
    phi[bi, ri, confuse] += rng.normal(4.0, 2.0, size=y.size).astype(np.float32)
    phi[..., c_n] = np.where(fg, rng.normal(3.0, 1.5, (b, r)), rng.normal(8.0, 1.5, (b, r)))
    return phi


def detect(split: SimSplit, priors: list[np.ndarray], config: SimConfig,
           log_counts: np.ndarray, progress: Callable[[int], None] | None = None) -> list[Detections]:
    """Detections for each log prior: calibrate, threshold 1e-4, top max_dets per image."""
    n_img, r = split.labels.shape
    c_n = len(log_counts)
    out = [[] for _ in priors]
    for lo in range(0, n_img, config.batch):
        hi = min(lo + config.batch, n_img)
        phi = proposal_logits(split, lo, hi, log_counts, config.bias, config.signal)
        for g, lp in enumerate(priors):
            s = calibrate(phi, lp)[..., :c_n].reshape(hi - lo, -1)  # [B, R*C]
            k = min(config.max_dets, s.shape[1])
            top = np.argpartition(-s, k - 1, axis=1)[:, :k]
            sc = np.take_along_axis(s, top, axis=1)
            keep = sc > SCORE_THRESH
            bi, _ = np.nonzero(keep)
            flat = top[keep]
            out[g].append((bi + lo, flat // c_n, flat % c_n, sc[keep]))
        if progress:
            progress(hi - lo)
    dets = []
    cat_ids = split.prepared.cat_ids
    for parts in out:
        img, prop, cls, score = (np.concatenate(x) for x in zip(*parts))
        dets.append(Detections(image_ids=split.prepared.img_ids[img], category_ids=cat_ids[cls],
                               scores=score.astype(np.float64), boxes=split.boxes[img, prop]))
    return dets


def run_benchmark(table, gammas: list[float], config: SimConfig,
                  progress: Callable[[str, int, int], None] | None = None) -> SimReport:
    """Sweep gamma on the train and val splits; pick gamma on train by AP, check it on val."""
    if not gammas:
        raise NorcalError("gammas: give at least one gamma", param="gammas")
    if config.train_images < 1:
        raise NorcalError(f"train_images must be >= 1, got {config.train_images}", param="train_images")
    # a simulated benchmark is vectorised in memory: past a million images it is a typo
    check_range("images", config.images, 1, 10 ** 6, integer=True)
    check_range("train_images", config.train_images, 1, 10 ** 6, integer=True)
    check_range("proposals", config.proposals, 8, 4096, integer=True)
    check_range("bias", config.bias, -100, 100, why="logits beyond that saturate float32")
    counts = table.counts("image")
    if sorted(table.category_ids) != list(table.category_ids):
        raise NorcalError(f"table {table.name!r}: categories must be in id order")
    log_counts = np.log(counts)
    priors = [log_prior(counts, g, names=table.names) for g in gammas]
    rows = {}
    for name, images, seed in (("train", config.train_images, config.seed + 1000),
                               ("val", config.images, config.seed)):
        split = make_split(table, images, seed, config)
        step = (lambda n, _name=name: progress(_name, n, images)) if progress else None
        dets = detect(split, priors, config, log_counts, step)
        rows[name] = [evaluate(split.prepared, d, "bbox", config.max_dets).stats for d in dets]
    pick = int(np.argmax([r["AP"] for r in rows["train"]]))
    best = int(np.argmax([r["AP"] for r in rows["val"]]))
    return SimReport(gammas=list(gammas), val=rows["val"], train=rows["train"],
                     gamma_train=gammas[pick], gamma_val=gammas[best], config=config)


def plot_sweep(path, report: SimReport) -> None:
    """PNG: AP, APr, APc, APf on val against gamma; the picked gamma marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from norcal.evaluation.report import save_figure

    fig, ax = plt.subplots(figsize=(6, 4))
    for key in ("AP", "APr", "APc", "APf"):
        ax.plot(report.gammas, [100 * r[key] for r in report.val], marker="o", label=key)
    ax.axvline(report.gamma_train, color="gray", ls="--", label=f"picked on train ({report.gamma_train:g})")
    ax.set_xlabel("gamma (CDT: a_c = N_c^gamma)")
    ax.set_ylabel("AP on simulated val (%)")
    ax.set_title("NorCal on the simulated LVIS benchmark")
    ax.legend()
    save_figure(fig, path)


__all__ = ["SimConfig", "SimReport", "make_split", "plot_sweep", "run_benchmark", "simulate_gt"]

