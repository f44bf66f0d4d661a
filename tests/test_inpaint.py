"""Object-removal inpainting (spurious-correlation study §3.1, Table 3): fills, masks, LaMa through
lama-cleaner (tiny TorchScript stand-in), its batched path, and resumable shards."""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from counterfactory.errors import ConfigError, InputError, ModelLoadError
from counterfactory.generation import inpaint as I
from counterfactory.models import registry, tiny


@pytest.fixture(scope="module")
def lama_folder(tmp_path_factory):
    return tiny.build("inpaint", tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def cfg(lama_folder):
    return {"models": {"inpaint": {"source": str(lama_folder), "library": "lama_cleaner"}}}


@pytest.fixture(scope="module")
def lama(cfg):
    return registry.load(cfg, "inpaint", device="cpu")


def _image(h=40, w=50, seed=0):
    """A smooth gradient plus noise (so inpainting and blurring visibly change the masked pixels)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 / w, yy * 255 / h, (xx + yy) * 127 / (h + w)], axis=-1)
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


def _mask(h=40, w=50):
    return I.boxes_to_mask([[10, 8, 30, 25]], h, w)


# --------------------------------------------------------------------------- fills


@pytest.mark.parametrize("method", ["zero", "mean", "blur", "opencv"])
def test_fill_keeps_unmasked_pixels(method):
    image, mask = _image(), _mask()
    out = I.fill(image, mask, method)
    assert out.dtype == np.uint8 and out.shape == image.shape
    assert np.array_equal(out[~mask], image[~mask])
    assert not np.array_equal(out[mask], image[mask])


def test_fill_values_inside_mask():
    image, mask = _image(), _mask()
    assert (I.fill(image, mask, "zero")[mask] == 0).all()

    # the schema's default (§4: "the average pixel values of B^r") is the mean of the removed region itself
    masked_mean = np.rint(image[mask].astype(np.float64).mean(axis=0)).astype(np.uint8)
    assert (I.fill(image, mask, "mean")[mask] == masked_mean).all()
    expected = np.rint(image[~mask].astype(np.float64).mean(axis=0)).astype(np.uint8)
    out = I.fill(image, mask, "mean", settings=I.InpaintSettings(mean_of="unmasked"))
    assert (out[mask] == expected).all()

    import cv2

    s = I.InpaintSettings(blur_sigma=3.0)
    k = 2 * math.ceil(3 * 3.0) + 1
    assert s.kernel == k == 19
    ref = cv2.GaussianBlur(image, (k, k), 3.0, sigmaY=3.0, borderType=cv2.BORDER_REFLECT_101)
    assert np.array_equal(I.fill(image, mask, "blur", settings=s)[mask], ref[mask])
    s5 = I.InpaintSettings(blur_sigma=3.0, blur_kernel=5)
    assert np.array_equal(I.fill(image, mask, "blur", settings=s5)[mask], cv2.GaussianBlur(image, (5, 5), 3.0)[mask])


def test_opencv_flags_and_lama_cleaner_model():
    """opencv goes through lama-cleaner's OpenCV2 model; Telea and Navier-Stokes differ."""
    image, mask = _image(), _mask()
    telea = I.fill(image, mask, "opencv")
    ns = I.fill(image, mask, "opencv", settings=I.InpaintSettings(cv2_flag="INPAINT_NS"))
    assert not np.array_equal(telea, ns)
    import cv2

    direct = cv2.inpaint(image[:, :, ::-1].copy(), mask.astype(np.uint8) * 255, 4, cv2.INPAINT_TELEA)[:, :, ::-1]
    assert np.array_equal(telea[mask], direct[mask])
    assert type(I.opencv_model()).__name__ == "OpenCV2"


def test_empty_mask_and_everything_masked():
    image = _image()
    empty = np.zeros(image.shape[:2], bool)
    for method in ("zero", "mean", "blur", "opencv"):
        assert np.array_equal(I.fill(image, empty, method), image)
    full = np.ones(image.shape[:2], bool)
    whole = np.rint(image.reshape(-1, 3).astype(np.float64).mean(0)).astype(np.uint8)
    assert (I.fill(image, full, "mean") == whole).all()   # no unmasked pixels: mean of the whole image


def test_bad_arguments():
    image = _image()
    with pytest.raises(ConfigError, match="unknown"):
        I.fill(image, _mask(), "median")
    with pytest.raises(ValueError, match="mask is 10x10"):
        I.fill(image, np.zeros((10, 10), bool), "zero")
    with pytest.raises(ConfigError, match="cv2_flag"):
        I.InpaintSettings(cv2_flag="TELEA")
    with pytest.raises(ConfigError, match="unknown keys"):
        I.InpaintSettings.from_config({"sigma": 3})
    assert I.InpaintSettings.from_config({"blur_sigma": 2, "method": "blur"}).blur_sigma == 2


# --------------------------------------------------------------------------- boxes_to_mask


def test_boxes_to_mask_hand_made():
    m = I.boxes_to_mask([[1, 1, 3, 2]], 4, 5)
    expected = np.zeros((4, 5), bool)
    expected[1, 1:3] = True
    assert np.array_equal(m, expected)
    # fractional: every pixel the box touches
    assert np.argwhere(I.boxes_to_mask([[0.5, 0.5, 2.0, 2.0]], 4, 5)).tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    # clipped to the image; a box entirely outside or of zero area adds nothing
    clipped = I.boxes_to_mask([[-3, -3, 2, 1], [10, 10, 12, 12], [2, 2, 2, 4]], 4, 5)
    assert np.argwhere(clipped).tolist() == [[0, 0], [0, 1]]
    assert np.array_equal(I.boxes_to_mask([[3, 2, 99, 99]], 4, 5)[2:, 3:], np.ones((2, 2), bool))
    # union of boxes, dilation grows every box by `dilate` pixels per side
    union = I.boxes_to_mask([[0, 0, 1, 1], [4, 3, 5, 4]], 4, 5)
    assert np.argwhere(union).tolist() == [[0, 0], [3, 4]]
    dil = I.boxes_to_mask([[2, 1, 3, 2]], 4, 5, dilate=1)
    assert np.argwhere(dil).tolist() == [[r, c] for r in range(0, 3) for c in range(1, 4)]
    assert not I.boxes_to_mask([], 4, 5).any() and not I.boxes_to_mask(None, 4, 5).any()
    assert np.array_equal(I.boxes_to_mask([1, 1, 3, 2], 4, 5), m)   # one box without the outer list
    with pytest.raises(ValueError, match="x2 < x1"):
        I.boxes_to_mask([[3, 0, 1, 2]], 4, 5)
    with pytest.raises(ValueError, match="non-finite"):
        I.boxes_to_mask([[0, 0, np.nan, 2]], 4, 5)


def test_boxes_to_mask_matches_loop():
    rng = np.random.default_rng(3)
    h, w = 23, 31
    xy = rng.uniform(-5, 35, (12, 2, 2))
    boxes = np.concatenate([xy.min(1), xy.max(1)], axis=1)[:, [0, 1, 2, 3]]
    for dilate in (0, 2):
        ref = np.zeros((h, w), bool)
        for x1, y1, x2, y2 in boxes:
            for r in range(h):
                for c in range(w):
                    if x2 > x1 and y2 > y1 and c + 1 > x1 - dilate and c < x2 + dilate \
                            and r + 1 > y1 - dilate and r < y2 + dilate:
                        ref[r, c] = True
        assert np.array_equal(I.boxes_to_mask(boxes, h, w, dilate=dilate), ref)


# --------------------------------------------------------------------------- LaMa via lama-cleaner


def test_tiny_lama_through_registry(lama, lama_folder, cfg):
    from lama_cleaner.model.lama import LaMa

    assert isinstance(lama, LaMa) and (lama_folder / "big-lama.pt").is_file()
    rec = registry.loaded_models()["inpaint"]
    assert rec["library"] == "lama_cleaner" and rec["fingerprint"] == registry.fingerprint(lama_folder)
    assert registry.verify_role(cfg, "inpaint")["problems"] == []
    image, mask = _image(), _mask()
    out = I.fill(image, mask, "lama", model=lama)
    assert np.array_equal(out[~mask], image[~mask])
    assert (out[mask] != image[mask]).mean() > 0.9
    # a source naming the .pt file itself also loads; its fingerprint is the file's sha256
    file_cfg = {"models": {"inpaint": {"source": str(lama_folder / "big-lama.pt"), "library": "lama_cleaner"}}}
    again = registry.load(file_cfg, "inpaint", device="cpu")
    assert np.array_equal(I.fill(image, mask, "lama", model=again), out)
    import hashlib

    digest = hashlib.sha256((lama_folder / "big-lama.pt").read_bytes()).hexdigest()
    assert registry.loaded_models()["inpaint"]["fingerprint"] == digest


def test_lama_model_url_set_and_restored(lama_folder, monkeypatch):
    import lama_cleaner.model.lama as lama_module

    monkeypatch.delenv("LAMA_MODEL_URL", raising=False)
    before = lama_module.LAMA_MODEL_URL
    seen = {}
    original = lama_module.load_jit_model

    def spy(url, device, md5):
        seen["url"] = url
        return original(url, device, md5)

    monkeypatch.setattr(lama_module, "load_jit_model", spy)
    I.load_lama(lama_folder, device="cpu")
    assert seen["url"] == str((lama_folder / "big-lama.pt").resolve())
    assert "LAMA_MODEL_URL" not in os.environ and lama_module.LAMA_MODEL_URL == before


def test_damaged_model_is_an_error_and_not_deleted(tmp_path):
    folder = tmp_path / "inpaint"
    folder.mkdir()
    (folder / "big-lama.pt").write_bytes(b"not a torchscript file")
    cfg = {"models": {"inpaint": {"source": str(folder), "library": "lama_cleaner"}}}
    with pytest.raises(ModelLoadError, match="big-lama.pt"):
        registry.load(cfg, "inpaint", device="cpu")
    assert (folder / "big-lama.pt").read_bytes() == b"not a torchscript file"   # lama-cleaner would delete it
    with pytest.raises(ModelLoadError, match="does not exist"):
        registry.load({"models": {"inpaint": {"source": str(tmp_path)}}}, "inpaint")
    with pytest.raises(ModelLoadError, match="not a local path"):
        registry.load({"models": {"inpaint": {"source": "https://example.org/big-lama.pt"}}}, "inpaint")


def _set(sizes, seed=0):
    images, masks = [], []
    for i, (h, w) in enumerate(sizes):
        images.append(_image(h, w, seed + i))
        masks.append(I.boxes_to_mask([[2 + i, 3, w // 2 + i, h - 4]], h, w))
    return images, masks


def _close(a: np.ndarray, b: np.ndarray) -> None:
    """Same pixels up to the documented tolerance: a float output within one ulp of a uint8 level may
    truncate to the neighbouring value under another batch size (rare; none on these images here)."""
    assert a.shape == b.shape and a.dtype == b.dtype == np.uint8
    diff = np.abs(a.astype(int) - b.astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-4


def test_batched_path_equals_lama_cleaner_call(lama):
    """lama_batch (one TorchScript call per same-size group) == lama-cleaner's own single-image call."""
    sizes = [(37, 53), (40, 48), (37, 53), (33, 33), (37, 53), (40, 48), (37, 53)]
    images, masks = _set(sizes)
    reference = [I.lama_cleaner_call(lama, im, m) for im, m in zip(images, masks)]
    batched = I.fill_batch(images, masks, "lama", model=lama, batch_size=8)
    for ref, got in zip(reference, batched):
        _close(ref, got)
    one_at_a_time = I.fill_batch(images, masks, "lama", model=lama, batch_size=1)
    for a, b in zip(batched, one_at_a_time):
        _close(a, b)
    unbatched = I.fill_batch(images, masks, "lama", model=lama, settings=I.InpaintSettings(batched=False))
    assert all(np.array_equal(a, b) for a, b in zip(reference, unbatched))
    with pytest.raises(ValueError, match="one size"):
        I.lama_batch(lama, images[:2], masks[:2])


# --------------------------------------------------------------------------- shards


def _items(tmp_path, n=6):
    sizes = [(37, 53), (40, 48)] * (n // 2)
    images, _ = _set(sizes)
    rows = []
    for i, im in enumerate(images):
        Image.fromarray(im).save(tmp_path / f"src{i}.png")
        h, w = im.shape[:2]
        boxes = [[2 + i, 3, w // 2, h - 4], [w - 8, 0, w + 5, 6]] if i != 3 else []   # item 3: nothing to remove
        rows.append({"item_id": f"it{i}", "image_path": f"src{i}.png", "boxes": boxes})
    return pd.DataFrame(rows)


def _decode(data: bytes) -> np.ndarray:
    import io

    return np.asarray(Image.open(io.BytesIO(data)))


def _outputs(folder, n=6):
    return {i: (folder / f"it{i}.png").read_bytes() for i in range(n)}


def test_inpaint_shard_writes_and_resumes(tmp_path, lama, cfg):
    src = tmp_path / "src"
    src.mkdir()
    items = _items(src)
    out = tmp_path / "out"
    summary = I.inpaint_shard(items, "lama", out, batch_size=4, cfg=cfg, device="cpu", image_root=src,
                              progress=False)
    assert summary == {"items": 6, "written": 6, "skipped": 0, "model_calls": 2, "method": "lama"}
    manifest = pd.read_parquet(out / "shard.parquet")
    assert manifest["item_id"].tolist() == [f"it{i}" for i in range(6)]
    assert manifest["output_path"].tolist() == [f"it{i}.png" for i in range(6)]
    assert manifest.loc[3, "mask_pixels"] == 0 and (manifest["mask_pixels"].drop(3) > 0).all()
    first = _outputs(out)
    for i, row in items.iterrows():
        got = np.asarray(Image.open(out / f"it{i}.png"))
        src_im = np.asarray(Image.open(src / row["image_path"]).convert("RGB"))
        mask = I.boxes_to_mask(row["boxes"], *src_im.shape[:2])
        assert np.array_equal(got[~mask], src_im[~mask])
        assert np.array_equal(got, I.fill(src_im, mask, "lama", model=lama))   # == lama-cleaner's own call

    # a half-written temporary file of a killed write is ignored (and cleaned), a truncated output redone
    stale = out / ".it1.png.tmp-abcd1234.png"
    stale.write_bytes(first[1][:40])
    (out / "it2.png").write_bytes(first[2][: len(first[2]) // 2])
    (out / "it4.png").unlink()
    third = I.inpaint_shard(items, "lama", out, batch_size=4, model=lama, image_root=src, progress=False)
    assert third["written"] == 2 and third["skipped"] == 4
    assert not stale.exists()
    redone = _outputs(out)
    assert all(redone[i] == first[i] for i in (0, 1, 3, 5))   # skipped: untouched
    for i in (2, 4):
        _close(np.asarray(Image.open(out / f"it{i}.png")), _decode(first[i]))
    assert pd.read_parquet(out / "shard.parquet").equals(manifest)


def test_inpaint_shard_key_covers_the_method(tmp_path):
    """Kill-and-rerun, cache hits and batch sizes: tests/test_shard_contract.py. Another method into the same
    folder: the keys differ, so every item is redone."""
    src = tmp_path / "src"
    src.mkdir()
    items = _items(src, n=2)
    part = tmp_path / "part"
    assert I.inpaint_shard(items, "blur", part, batch_size=2, image_root=src, progress=False)["written"] == 2
    assert I.inpaint_shard(items, "blur", part, batch_size=2, image_root=src, progress=False)["skipped"] == 2
    assert I.inpaint_shard(items, "zero", part, batch_size=2, image_root=src, progress=False)["written"] == 2


def test_inpaint_shard_masks_and_errors(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    items = _items(src, n=2)
    h, w = 37, 53
    mask = np.zeros((h, w), bool)
    mask[5:15, 5:25] = True
    Image.fromarray(mask.astype(np.uint8) * 255).save(src / "mask0.png")
    with_masks = items.drop(columns="boxes").assign(mask=["mask0.png", np.ones((40, 48), bool)])
    out = tmp_path / "out"
    res = I.inpaint_shard(with_masks, "zero", out, image_root=src, progress=False)
    assert res["written"] == 2
    got = np.asarray(Image.open(out / "it0.png"))
    assert (got[mask] == 0).all() and np.array_equal(got[~mask], np.asarray(Image.open(src / "src0.png"))[~mask])
    assert (np.asarray(Image.open(out / "it1.png")) == 0).all()

    wrong = with_masks.assign(mask=["mask0.png", np.ones((48, 40), bool)])
    with pytest.raises(InputError, match=r"record it1: mask is 48x40 \(HxW\) but its image is 40x48"):
        I.inpaint_shard(wrong, "zero", tmp_path / "bad", image_root=src, progress=False, source="items.parquet")
    with pytest.raises(InputError, match="record it0: bad boxes"):
        I.inpaint_shard(items.assign(boxes=[[[5, 5, 1, 1]], []]), "zero", tmp_path / "bad", image_root=src,
                        progress=False)
    with pytest.raises(InputError, match="occurs twice"):
        I.inpaint_shard(items.assign(item_id=["a", "a"]), "zero", tmp_path / "bad", image_root=src, progress=False)
    with pytest.raises(InputError, match="not found"):
        I.inpaint_shard(items, "zero", tmp_path / "bad", progress=False)   # relative to the working directory
    with pytest.raises(ConfigError, match="needs cfg"):
        I.inpaint_shard(items, "lama", tmp_path / "bad", image_root=src, progress=False)
