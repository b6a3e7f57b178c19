"""Test inputs for parity runs when the user gives no images."""

from __future__ import annotations

import numpy as np


def synthetic_images(n: int = 3, seed: int = 0) -> list[np.ndarray]:
    """``n`` RGB uint8 test images of varied sizes: a smooth background with a few solid
    rectangles and discs, so a detector fires on object-like shapes. Deterministic per seed."""
    rng = np.random.default_rng(seed)
    sizes = [(480, 640), (600, 400), (512, 512), (375, 500), (427, 640)]
    out = []
    for i in range(n):
        h, w = sizes[i % len(sizes)]
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        base = rng.uniform(40, 215, 3).astype(np.float32)
        img = base + 30 * np.stack([np.sin(xx / (40 + 10 * c) + c) * np.cos(yy / 57.0) for c in range(3)], -1)
        for _ in range(int(rng.integers(3, 7))):
            color = rng.uniform(0, 255, 3)
            y0, x0 = int(rng.integers(0, h - 40)), int(rng.integers(0, w - 40))
            bh, bw = int(rng.integers(30, max(31, h // 2))), int(rng.integers(30, max(31, w // 2)))
            if rng.random() < 0.5:
                img[y0:y0 + bh, x0:x0 + bw] = color
            else:
                cy, cx, r = y0 + bh / 2, x0 + bw / 2, min(bh, bw) / 2
                img[(yy - cy) ** 2 + (xx - cx) ** 2 <= r * r] = color
        img += rng.normal(0, 4, img.shape)
        out.append(np.clip(img, 0, 255).astype(np.uint8))
    return out

