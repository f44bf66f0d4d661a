"""Write the CVLD demo fixtures: resources/demo/celeba/ and resources/demo/fairface/ (official layouts,
synthetic 64x64 cartoon faces drawn with PIL; no row or image comes from CelebA or FairFace).

Run from the repository root: ``python resources/demo/celeba/make_fixtures.py``. Deterministic.
"""

from __future__ import annotations

import random
from pathlib import Path

from PIL import Image, ImageDraw

import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src"))
from counterfactory.data.celeba import ATTRIBUTES, GENDER_INDEPENDENT  # noqa: E402
from counterfactory.data.fairface import AGES, RACES  # noqa: E402

HERE = Path(__file__).resolve().parent
SKIN = [(241, 205, 178), (224, 172, 135), (198, 134, 96), (141, 85, 56), (92, 58, 40)]
HAIR = {"Black_Hair": (25, 20, 20), "Blond_Hair": (230, 200, 110), "Brown_Hair": (110, 70, 40),
        "Gray_Hair": (170, 170, 170)}


def face(path: Path, male: bool, attrs: dict, skin: tuple, seed: int) -> None:
    rng = random.Random(seed)
    im = Image.new("RGB", (64, 64), tuple(rng.randrange(150, 250) for _ in range(3)))
    d = ImageDraw.Draw(im)
    hair = next((HAIR[k] for k in HAIR if attrs.get(k)), (60, 40, 30))
    if not male:
        d.rectangle([12, 14, 52, 58], fill=hair)                 # long hair
    d.ellipse([16, 12, 48, 52] if not attrs.get("Chubby") else [13, 12, 51, 54], fill=skin)
    d.chord([16, 8, 48, 30], 180, 360, fill=hair)                 # top of the head
    if attrs.get("Bangs"):
        d.rectangle([18, 16, 46, 22], fill=hair)
    eye_h = 1 if attrs.get("Narrow_Eyes") else 3
    for x in (24, 37):
        d.rectangle([x, 27, x + 3, 27 + eye_h], fill=(30, 30, 30))
        if attrs.get("Bags_Under_Eyes"):
            d.line([x, 32, x + 3, 32], fill=(120, 80, 90))
        if attrs.get("Eyeglasses"):
            d.rectangle([x - 2, 25, x + 5, 32], outline=(0, 0, 0))
    if attrs.get("High_Cheekbones"):
        for x in (20, 42):
            d.ellipse([x, 34, x + 4, 37], fill=(230, 120, 120))
    if attrs.get("Smiling"):
        d.arc([25, 36, 39, 46], 0, 180, fill=(150, 30, 30), width=2)
    elif attrs.get("Mouth_Slightly_Open"):
        d.ellipse([29, 40, 35, 45], fill=(90, 20, 20))
    else:
        d.line([27, 42, 37, 42], fill=(150, 30, 30), width=2)
    if attrs.get("Wearing_Earrings"):
        for x in (15, 47):
            d.ellipse([x, 36, x + 3, 39], fill=(250, 215, 0))
    if attrs.get("Wearing_Hat"):
        d.rectangle([12, 6, 52, 14], fill=(40, 60, 160))
    if male and rng.random() < 0.5:
        d.rectangle([24, 46, 40, 50], fill=hair)                  # beard
    im.save(path, quality=80)


def celeba(root: Path) -> None:
    (root / "img_align_celeba").mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    rows, parts, n = [], [], 0
    for code in (0, 1, 2):                                        # 8 images per partition, 4 per gender
        for male in (1, 0):
            for j in range(4):
                n += 1
                name = f"{n:06d}.jpg"
                vals = {a: rng.choice((0, 1)) for a in ATTRIBUTES}
                for k, a in enumerate(GENDER_INDEPENDENT):        # each gender: 2 positives, 2 negatives
                    vals[a] = int((j + k + code) % 4 < 2)
                vals["Male"] = male
                face(root / "img_align_celeba" / name, bool(male), vals, SKIN[(n + code) % len(SKIN)], n)
                rows.append(name + "".join(f" {'1' if vals[a] else '-1':>2}" for a in ATTRIBUTES))
                parts.append(f"{name} {code}")
    (root / "list_attr_celeba.txt").write_text(f"{len(rows)}\n{' '.join(ATTRIBUTES)}\n" + "\n".join(rows) + "\n")
    (root / "list_eval_partition.txt").write_text("\n".join(parts) + "\n")


def fairface(root: Path) -> None:
    (root / "val").mkdir(parents=True, exist_ok=True)
    lines = ["file,age,gender,race,service_test"]
    for i in range(1, 21):
        male = i % 2 == 1
        race = RACES[(i // 2) % len(RACES)]
        age = AGES[2 + i % 6]
        face(root / "val" / f"{i}.jpg", male, {"Smiling": i % 3 == 0, "Eyeglasses": i % 4 == 0},
             SKIN[i % len(SKIN)], 100 + i)
        lines.append(f"val/{i}.jpg,{age},{'Male' if male else 'Female'},{race},{i % 3 != 0}")
    (root / "fairface_label_val.csv").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    celeba(HERE)
    fairface(HERE.parent / "fairface")
