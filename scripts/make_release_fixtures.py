"""Regenerate the tiny stand-ins of the published releases under resources/demo/releases/ (layouts:
Intel/COCO-Counterfactuals and Intel/SocialCounterfactuals on the Hugging Face Hub). Nothing in them comes from the releases: the COCO-Counterfactuals pairs are
three demo photos (resources/demo/coco2017/val2017) and a colour-changed copy of each, with demo captions and one noun
swapped; the SocialCounterfactuals images are flat colour squares.

    python scripts/make_release_fixtures.py            # rewrites the files (byte-identical on one machine)

* coco_counterfactuals/data/examples.jsonl, data/images.zip: 3 examples; two images under ``images/`` (the
  loading script's first convention), one at the zip's top level (its later convention, commit 22a3b9c);
* coco_counterfactuals/coco_counterfactuals_captions.jsonl: the caption-only release of the same captions;
* social_counterfactuals/data/train-00000-of-00001-<16 hex>.parquet: written by ``datasets`` (``Dataset.to_parquet``
  with an Image feature), 3 occupations x 1 race-gender set x 4 images; the hash is the file's sha256.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tempfile
import zipfile
from pathlib import Path

from PIL import Image, ImageOps

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "resources" / "demo" / "releases"
DEMO = REPO / "resources" / "demo" / "coco2017" / "val2017"

#: id, original caption, counterfactual caption, zip folder ("images/" or "")
COCO = [
    ("101_0", "An astronaut in an orange suit smiles in front of a flag.",
     "An astronaut in an orange suit smiles in front of a banner.", "images/"),
    ("102_1", "A black and white photo of a photographer in a field.",
     "A black and white photo of a photographer in a forest.", "images/"),
    ("103_0", "A tabby cat sits and looks to the side.", "A tabby dog sits and looks to the side.", ""),
]
#: counterfactual_set, prefix, subject; every set: race {White, Indian} x gender {male, female}
SOCIAL = [("1041", "A picture of a", "doctor"), ("2217", "A picture of a", "plumber"), ("3090", "A photo of a", "nurse")]
RACES = {"White": (230, 200, 180), "Indian": (150, 100, 60)}
GENDERS = {"male": 40, "female": 200}


def jpeg(image: Image.Image, quality: int = 80) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def coco(out: Path) -> None:
    data = out / "data"
    data.mkdir(parents=True)
    lines, captions = [], []
    with zipfile.ZipFile(data / "images.zip", "w", compression=zipfile.ZIP_STORED) as zf:
        for pid, cap0, cap1, folder in COCO:
            photo = Image.open(DEMO / f"{int(pid.split('_')[0]):012d}.jpg").convert("RGB")
            photo = ImageOps.fit(photo, (48, 48))
            for k, im in enumerate((photo, ImageOps.invert(photo))):   # the "counterfactual" image: inverted colours
                info = zipfile.ZipInfo(f"{folder}{pid}_img_{k}.jpg", date_time=(2023, 1, 1, 0, 0, 0))
                zf.writestr(info, jpeg(im))
            lines.append({"id": pid, "image_0": f"{pid}_img_0", "image_1": f"{pid}_img_1", "caption_0": cap0,
                          "caption_1": cap1})
            captions.append({"coco-counterfactual-index": pid, "original_caption": cap0,
                             "counterfactual_caption": cap1})
    (data / "examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    (out / "coco_counterfactuals_captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in captions),
                                                            encoding="utf-8")


def social(out: Path) -> None:
    import datasets

    rows = {k: [] for k in ("image", "caption", "counterfactual_set", "a1_type", "a1", "a2_type", "a2", "a1a2")}
    for set_id, prefix, subject in SOCIAL:
        for race, colour in RACES.items():
            for gender, shade in GENDERS.items():
                im = Image.new("RGB", (24, 24), colour)
                im.paste((shade, shade, shade), (6, 6, 18, 18))
                article = "an" if race[0] in "AEIOU" else "a"
                rows["image"].append({"bytes": jpeg(im), "path": None})
                rows["caption"].append(f"{prefix[:-2]} {article} {race} {gender} {subject}")
                rows["counterfactual_set"].append(set_id)
                rows["a1_type"].append("race")
                rows["a1"].append(race)
                rows["a2_type"].append("gender")
                rows["a2"].append(gender)
                rows["a1a2"].append(f"{race} {gender}")
    features = datasets.Features({"image": datasets.Image(), **{k: datasets.Value("string") for k in rows
                                                                if k != "image"}})
    ds = datasets.Dataset.from_dict(rows, features=features)
    data = out / "data"
    data.mkdir(parents=True)
    tmp = data / "shard.parquet"
    ds.to_parquet(str(tmp))
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()[:16]
    tmp.rename(data / f"train-00000-of-00001-{digest}.parquet")


def main() -> None:
    with tempfile.TemporaryDirectory(dir=OUT.parent) as tmp:
        tmp = Path(tmp)
        coco(tmp / "coco_counterfactuals")
        social(tmp / "social_counterfactuals")
        for name in ("coco_counterfactuals", "social_counterfactuals"):
            shutil.rmtree(OUT / name, ignore_errors=True)
            OUT.mkdir(parents=True, exist_ok=True)
            shutil.move(tmp / name, OUT / name)
    for p in sorted(OUT.rglob("*")):
        if p.is_file():
            print(f"{p.relative_to(REPO)}  {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
