"""Benchmark ``counterfactory.metrics.recall_at_k`` against a naive full-argsort implementation.

Default size: COCO-5k-like, 5,000 images × 25,000 texts (5 per image), float32 scores.
Goal: R@1/5/10 in both directions in under 2 s on a 2-core machine.

    python benchmarks/bench_recall.py                      # full size, with the naive baseline
    python benchmarks/bench_recall.py --images 1000 --texts-per-image 5 --repeats 5
    python benchmarks/bench_recall.py --skip-naive

Prints the seconds of each implementation (best of ``--repeats`` for ours, one run for the naive
one), their ratio, and whether both give the same numbers.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from counterfactory.metrics import recall_at_k


def naive_recall(similarity: np.ndarray, text_image: np.ndarray, ks=(1, 5, 10)) -> dict[str, float]:
    """BLIP-style reference: full argsort of every row/column, rank = position of the positive."""
    n_img, n_txt = similarity.shape
    # image -> text: rank of the best-placed ground-truth text in the image's sorted row
    order = np.argsort(-similarity, axis=1)                     # (n_img, n_txt)
    position = np.empty_like(order)
    np.put_along_axis(position, order, np.arange(n_txt)[None, :].repeat(n_img, 0), axis=1)
    pos_of_own = position[text_image, np.arange(n_txt)]
    i2t = np.full(n_img, n_txt)
    np.minimum.at(i2t, text_image, pos_of_own)
    del order, position
    # text -> image: position of the text's image in its sorted column
    order_t = np.argsort(-similarity.T, axis=1)                 # (n_txt, n_img)
    t2i = np.argmax(order_t == text_image[:, None], axis=1)
    out = {f"image_to_text@{k}": 100.0 * np.mean(i2t < k) for k in ks}
    out.update({f"text_to_image@{k}": 100.0 * np.mean(t2i < k) for k in ks})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--texts-per-image", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-naive", action="store_true")
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    n_img = args.images
    n_txt = n_img * args.texts_per_image
    text_image = np.repeat(np.arange(n_img), args.texts_per_image)
    similarity = rng.standard_normal((n_img, n_txt), dtype=np.float32)
    # make the task non-trivial but not hopeless: boost each (image, own text) score
    similarity[text_image, np.arange(n_txt)] += np.float32(3.0)
    print(f"similarity: {n_img} images x {n_txt} texts, {similarity.dtype}, "
          f"{similarity.nbytes / 2**20:.0f} MiB")

    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        ours = recall_at_k(similarity, text_image, ks=(1, 5, 10))
        times.append(time.perf_counter() - t0)
    best = min(times)
    print(f"recall_at_k (ours):  best {best:.3f} s of {args.repeats} runs "
          f"({', '.join(f'{t:.3f}' for t in times)})")
    print("  " + ", ".join(f"{k}={v:.2f}" for k, v in ours.items()))

    if not args.skip_naive:
        t0 = time.perf_counter()
        ref = naive_recall(similarity, text_image)
        naive = time.perf_counter() - t0
        same = all(abs(ours[k] - ref[k]) < 1e-9 for k in ours)
        print(f"naive argsort:       {naive:.3f} s")
        print(f"speed-up:            {naive / best:.1f}x   identical results: {same}")
        if not same:
            print("  naive: " + ", ".join(f"{k}={v:.2f}" for k, v in ref.items()))


if __name__ == "__main__":
    main()
