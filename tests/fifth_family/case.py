# --- toy: the fifth family's case, added by tests/export/families/test_fifth_family.py ----------
# (appended to a copy of tests/family_cases.py: it uses that module's names)

TOY_WEIGHT = [[2.0, -1.0, 0.5], [0.3, 1.2, -0.4], [-0.5, 0.2, 1.5], [1.0, 1.0, 1.0], [0.0, 0.5, 0.5]]
TOY_BIAS = [0.1, 0.2, -0.3, 0.0, 0.4]
TOY_COUNTS = [500, 50, 5, 1]
# (height, width, RGB): shortest edge to 32 (max 64) resizes each exactly; pairs differ in size
TOY_IMAGES = [(40, 60, (200, 30, 90)), (50, 50, (10, 220, 40)), (64, 80, (90, 90, 250)), (20, 30, (120, 60, 10))]


def _toy_make(folder: Path) -> Checkpoint:
    import json

    from PIL import Image

    (folder / "m.toy").write_text(json.dumps({"weight": TOY_WEIGHT, "bias": TOY_BIAS}))
    table = folder / "table.json"
    table.write_text(json.dumps({"name": "toy_table", "source": "test", "count_type": "image", "categories": [
        {"id": 10 + i, "name": f"c{i}", "image_count": n, "instance_count": n} for i, n in enumerate(TOY_COUNTS)]}))
    images = []
    for k, (h, w, rgb) in enumerate(TOY_IMAGES):
        images.append(folder / f"toy{k}.png")
        Image.fromarray(np.full((h, w, 3), rgb, np.uint8)).save(images[-1])
    return Checkpoint(folder / "m.toy", table, images)


def _toy_reference(ckpt: Checkpoint, gammas: tuple[float, ...]) -> dict[float, list[Reference]]:
    """The paper's formula by hand: logits over the mean colour / 255, the foreground logits
    minus gamma log N_c, softmax over all five; one detection, the whole resized image."""
    out: dict[float, list[Reference]] = {g: [] for g in gammas}
    for h, w, rgb in TOY_IMAGES:
        s = 32 / min(h, w)
        for gamma in gammas:
            phi = np.array(TOY_WEIGHT) @ (np.array(rgb) / 255.0) + np.array(TOY_BIAS)
            phi[:4] -= gamma * np.log(TOY_COUNTS)
            p = np.exp(phi - phi.max()) / np.exp(phi - phi.max()).sum()
            best = int(np.argmax(p[:4]))
            out[gamma].append(Reference(np.array([[0, 0, w * s, h * s]], np.float32),
                                        np.array([p[best]], np.float32), np.array([best])))
    return out


CASES["toy"] = FamilyCase("toy", _toy_make, _toy_reference, min_detections=1,
                          not_applicable={"search": CHECKPOINT_EXPORT})
