#!/usr/bin/env python
"""Regenerate the demo's COCO datasets under resources/demo/ in the official MS-COCO 2017 / 2014 and Karpathy
layouts of the data catalogue (docs/data.md): ``coco2017/{val2017,annotations}``, ``coco2014/{val2014,annotations,
dataset_coco.json}`` (the same photos under their 2014 names; the Karpathy file splits them 7 train / 2 val / 3 test,
as the spurious-correlation study's demo needs every split) and the demo's two cuts, other Karpathy splits of the same
photos: ``cuts/dataset_coco_test.json`` (all test; ``cuts/dataset_coco_cvld.json``, 8 train / 4 test with gendered
captions, is hand-written and left alone).

Source images: twelve photographs bundled inside the scikit-image wheel (``skimage/data``), each public
domain or CC0 (see resources/demo/LICENSES.md). The script fetches the wheel from PyPI with
``pip download`` (or takes ``--wheel PATH``), resizes each image to at most 256 px on its long side
(JPEG quality 85) and writes hand-written COCO-style captions (3 to 6 per image, so readers never
assume five) and object boxes with real COCO category ids.

    python scripts/make_demo_dataset.py [--wheel scikit_image-0.26.0-...whl] [--out resources/demo]
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from PIL import Image

SKIMAGE = "scikit-image==0.26.0"
#: the demo's Karpathy split of coco2014/dataset_coco.json (cocoid -> split; the rest test): every split occurs,
#: for the spurious-correlation study
SPLIT_ODMAP = {101: "train", 103: "train", 105: "train", 106: "train", 108: "train", 109: "train", 110: "train",
               111: "val", 112: "val"}
LONG_SIDE = 256

# (coco-style id, file in skimage/data, licence, captions, boxes [(category_id, x, y, w, h) in source px,
#  drawn by hand on a 50 px grid over the source image; real COCO 2017 category ids])
IMAGES = [
    (101, "astronaut.png", "public domain (NASA)", [
        "An astronaut in an orange suit smiles in front of a flag.",
        "A woman in a space suit poses for a portrait.",
        "A smiling astronaut stands beside a model of a shuttle.",
        "A portrait of a woman wearing an orange flight suit.",
        "An astronaut holding a helmet in front of a flag.",
    ], [(1, 20, 15, 345, 497)]),
    (102, "camera.png", "CC0 (Lav Varshney)", [
        "A man looks through a camera on a tripod in a park.",
        "A black and white photo of a photographer in a field.",
        "A man in a coat stands behind a camera on the grass.",
        "A photographer with a camera on a tripod near some buildings.",
    ], [(1, 0, 64, 332, 448)]),
    (103, "chelsea.png", "CC0 (Stefan van der Walt)", [
        "A tabby cat sits and looks to the side.",
        "A close up of a cat with green eyes.",
        "A striped cat rests on a wooden floor.",
        "A cat with long whiskers looks at something.",
        "A brown cat sitting in front of a wall.",
        "A small cat turns its head toward the window.",
    ], [(17, 0, 0, 410, 300)]),
    (104, "coffee.png", "CC0 (Rachel Michetti)", [
        "A cup of coffee on a saucer with a spoon.",
        "A white cup filled with coffee sits on a table.",
        "A coffee cup and a spoon on a wooden table.",
    ], [(47, 173, 18, 237, 287), (50, 325, 65, 100, 260)]),
    (105, "horse.png", "CC0 (Andreas Preuss, openclipart)", [
        "A black silhouette of a horse on a white background.",
        "The shadow of a horse walking to the left.",
        "A drawing of a horse with its tail up.",
        "A dark horse shape against a plain background.",
    ], [(19, 17, 8, 373, 304)]),
    (106, "rocket.jpg", "public domain (SpaceX)", [
        "A rocket stands on a launch pad under a blue sky.",
        "A tall white rocket next to a tower.",
        "A rocket waits for launch beside the ocean.",
        "A space rocket on a pad with clouds in the sky.",
        "A white rocket and a tower at a launch site.",
    ], []),
    (107, "clock_motion.png", "public domain (Stefan van der Walt)", [
        "A blurry photo of a clock on a wall.",
        "A round clock with black hands and numbers.",
        "A wall clock photographed with motion blur.",
        "A clock hanging on a white wall.",
    ], [(85, 140, 93, 146, 125)]),
    (108, "coins.png", "no known copyright restrictions (Brooklyn Museum)", [
        "A collection of old coins on a dark table.",
        "Rows of ancient coins laid out on a cloth.",
        "A black and white photo of many coins.",
    ], []),
    (109, "grass.png", "CC0 (linolafett, DeviantArt)", [
        "A close up of green grass in a field.",
        "Long blades of grass in a meadow.",
        "A patch of grass seen from above.",
        "Thick grass growing on a lawn.",
    ], []),
    (110, "brick.png", "CC0 (CC0Textures)", [
        "A wall made of red bricks.",
        "Rows of old bricks in a building wall.",
        "A brick wall with grey mortar between the bricks.",
    ], []),
    (111, "gravel.png", "CC0 (CC0Textures)", [
        "A pile of small stones on the ground.",
        "Grey gravel covers the path.",
        "A close up of rocks and pebbles on a road.",
        "Small pebbles scattered across the ground.",
        "A path covered with gravel and sand.",
    ], []),
    (112, "hubble_deep_field.jpg", "public domain (NASA)", [
        "Many galaxies shine in the dark sky.",
        "A telescope picture of stars and galaxies in space.",
        "Bright galaxies scattered across a black background.",
        "A view of deep space with many stars.",
    ], []),
]

CATEGORIES = [(1, "person", "person"), (17, "cat", "animal"), (19, "horse", "animal"), (47, "cup", "kitchen"),
              (50, "spoon", "kitchen"), (85, "clock", "indoor")]


def fetch_wheel(dest: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", SKIMAGE,
                    "-d", str(dest)], check=True)
    return next(dest.glob("scikit_image-*.whl"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheel", type=Path, help="scikit-image wheel (default: pip download it)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "resources" / "demo")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.wheel or fetch_wheel(Path(tmp))
        c17, c14, cuts = args.out / "coco2017", args.out / "coco2014", args.out / "cuts"
        for folder in (c17 / "val2017", c17 / "annotations", c14 / "val2014", c14 / "annotations", cuts):
            folder.mkdir(parents=True, exist_ok=True)
        images, captions, instances, karpathy, licences = [], [], [], [], []
        ann_id, sent_id = 1, 0
        with zipfile.ZipFile(wheel) as zf:
            for image_id, source, licence, texts, boxes in IMAGES:
                im = Image.open(io.BytesIO(zf.read(f"skimage/data/{source}"))).convert("RGB")
                scale = LONG_SIDE / max(im.size)
                small = im.resize((round(im.width * scale), round(im.height * scale)), Image.Resampling.LANCZOS)
                name = f"{image_id:012d}.jpg"
                small.save(c17 / "val2017" / name, quality=85, optimize=True)
                small.save(c14 / "val2014" / f"COCO_val2014_{name}", quality=85, optimize=True)
                images.append({"license": 1, "file_name": name, "coco_url": "", "height": small.height,
                               "width": small.width, "date_captured": "", "flickr_url": "", "id": image_id})
                sentences = []
                for text in texts:
                    captions.append({"image_id": image_id, "id": ann_id, "caption": text})
                    sentences.append({"tokens": text.lower().rstrip(".").split(), "raw": text, "imgid": image_id,
                                      "sentid": sent_id})
                    ann_id += 1
                    sent_id += 1
                for cat, x, y, w, h in boxes:
                    # scale to the resized image and clip there (rounding the size must not push a box out)
                    x0, y0 = round(x * scale, 2), round(y * scale, 2)
                    x1, y1 = min(round((x + w) * scale, 2), small.width), min(round((y + h) * scale, 2), small.height)
                    bx = [x0, y0, round(x1 - x0, 2), round(y1 - y0, 2)]
                    instances.append({"segmentation": [[bx[0], bx[1], bx[0] + bx[2], bx[1], bx[0] + bx[2],
                                                        bx[1] + bx[3], bx[0], bx[1] + bx[3]]],
                                      "area": round(bx[2] * bx[3], 2), "iscrowd": 0, "image_id": image_id,
                                      "bbox": bx, "category_id": cat, "id": ann_id})
                    ann_id += 1
                karpathy.append({"filepath": "val2014", "sentids": [s["sentid"] for s in sentences],
                                 "filename": f"COCO_val2014_{name}", "imgid": image_id, "split": "test",
                                 "sentences": sentences, "cocoid": image_id})
                licences.append(f"| {name} | skimage/data/{source} | {licence} |")
        info = {"description": "CounterFactory demo (COCO 2017 format)", "version": "1.0", "year": 2026}
        lic = [{"id": 1, "name": "Public domain / CC0", "url": ""}]
        cats = [{"supercategory": s, "id": i, "name": n} for i, n, s in CATEGORIES]
        dump = lambda obj, path: path.write_text(json.dumps(obj, indent=1) + "\n")  # noqa: E731
        dump({"info": info, "licenses": lic, "images": images, "annotations": captions},
             c17 / "annotations" / "captions_val2017.json")
        dump({"info": info, "licenses": lic, "images": images, "annotations": instances, "categories": cats},
             c17 / "annotations" / "instances_val2017.json")
        images14 = [{**im, "file_name": f"COCO_val2014_{im['file_name']}"} for im in images]
        dump({"info": {**info, "description": "CounterFactory demo (COCO 2014 format: the demo photos as val2014)"},
              "licenses": lic, "images": images14, "annotations": instances, "categories": cats},
             c14 / "annotations" / "instances_val2014.json")
        dump({"info": info, "licenses": lic, "images": [], "annotations": [], "categories": cats},
             c14 / "annotations" / "instances_train2014.json")
        # (cuts/dataset_coco_cvld.json is written by hand: the same photos, 8 train / 4 test, with captions that
        # name a gendered person, so CVLD's interventions have something to swap; this script leaves it alone)
        for path, splits in ((c14 / "dataset_coco.json", SPLIT_ODMAP), (cuts / "dataset_coco_test.json", {})):
            rows = [{**row, "split": splits.get(row["cocoid"], "test")} for row in karpathy]
            dump({"images": rows, "dataset": "coco"}, path)
        (args.out / "LICENSES.md").write_text(
            "# Demo images\n\nTwelve sample photographs bundled in the scikit-image wheel "
            f"({SKIMAGE}, `skimage/data`), resized to {LONG_SIDE} px on the long side. Captions and boxes "
            "were written for CounterFactory. Regenerate with `python scripts/make_demo_dataset.py`.\n\n"
            "| file | source | licence |\n| --- | --- | --- |\n" + "\n".join(licences) + "\n")
    print(f"wrote {len(images)} images, {len(captions)} captions, {len(instances)} boxes to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
