"""Benchmark of object-removal inpainting with LaMa on the tiny TorchScript stand-in (not part of the test suite).

images/s of the batched path (:func:`counterfactory.generation.inpaint.fill_batch`: ``--batch`` same-size
images per TorchScript call) against one image at a time, both through lama-cleaner's own
``LaMa.__call__`` (what lama-cleaner offers: pad, run, blend, one image per call) and through the
direct path with batch 1, on the same images and masks. Prints the ratios of one run (the faster of
``--repeats`` alternating repetitions per mode), by wall time and by process CPU time (less sensitive to
other jobs on shared cores), and the largest pixel difference between the modes.

    .venv/bin/python benchmarks/bench_inpaint.py                  # 32 images of 256x256, ~15 s on 2 cores
    .venv/bin/python benchmarks/bench_inpaint.py --device cuda    # on a GPU

The tiny model is randomly initialised (about 10k parameters): the numbers measure the machinery, not
big-lama's cost or quality. On CPU the batched path is not always faster: with one thread it ran 0.38-0.44x the
speed of lama-cleaner's call at 256x256 (a batch's activations outgrow the caches) and 1.3-1.7x at 64x64
(two runs each on shared cores).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--size", type=int, default=256, help="image side")
    ap.add_argument("--batch", type=int, default=8, help="images per TorchScript call in batched mode")
    ap.add_argument("--repeats", type=int, default=2, help="alternating repetitions (fastest kept)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="auto, cpu, cuda or hpu")
    ap.add_argument("--models", type=Path, default=None, help="folder with a tiny inpaint/ (else built)")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    from counterfactory.generation import inpaint as I
    from counterfactory.models import registry, tiny

    torch.set_num_threads(args.threads)
    tmp = tempfile.TemporaryDirectory()
    models = args.models or Path(tmp.name)
    if not (models / "inpaint").exists():
        tiny.build("inpaint", models)
    cfg = {"models": {"inpaint": {"source": str(models / "inpaint"), "library": "lama_cleaner"}}}
    lama = registry.load(cfg, "inpaint", device=args.device)
    rng = np.random.default_rng(0)
    n, s = args.images, args.size
    images = [rng.integers(0, 256, (s, s, 3), dtype=np.uint8) for _ in range(n)]
    masks = []
    for _ in range(n):
        x1, y1 = rng.integers(0, s // 2, 2)
        w, h = rng.integers(s // 8, s // 2, 2)
        masks.append(I.boxes_to_mask([[x1, y1, x1 + w, y1 + h]], s, s))

    def sync():
        if lama.device.type == "cuda":
            torch.cuda.synchronize()

    modes = {
        "lama-cleaner LaMa.__call__, one image per call": lambda: [I.lama_cleaner_call(lama, im, m)
                                                                 for im, m in zip(images, masks)],
        "direct TorchScript path, batch 1": lambda: I.fill_batch(images, masks, "lama", model=lama, batch_size=1),
        f"direct TorchScript path, batch {args.batch}": lambda: I.fill_batch(images, masks, "lama", model=lama,
                                                                             batch_size=args.batch),
    }
    print(f"torch threads {torch.get_num_threads()}, device {lama.device}, {n} images of {s}x{s}, "
          f"batch {args.batch} vs one at a time", flush=True)
    for fn in modes.values():  # warm-up
        fn()
    best = {k: float("inf") for k in modes}
    cpu = dict(best)
    outs = {}
    for _ in range(args.repeats):
        for name, fn in modes.items():
            sync()
            t, c = time.perf_counter(), time.process_time()
            outs[name] = np.stack(fn())
            sync()
            best[name] = min(best[name], time.perf_counter() - t)
            cpu[name] = min(cpu[name], time.process_time() - c)
    names = list(modes)
    batched = names[-1]
    for name in names:
        print(f"{name:48s} {n / best[name]:8.1f} images/s  ({best[name]:.3f} s wall, {cpu[name]:.3f} s CPU)")
    for name in names[:-1]:
        diff = np.abs(outs[name].astype(int) - outs[batched].astype(int))
        print(f"ratio batch {args.batch} / {name}: {best[name] / best[batched]:.2f}x wall, "
              f"{cpu[name] / cpu[batched]:.2f}x CPU time; max pixel difference {diff.max()}")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
