"""Benchmark of CounterCurate's grounded generation on the tiny models (not part of the test suite).

images/s of batched GLIGEN generation (``--batch`` items per pipeline call, each with its own
phrases, boxes and generator) against one item per call, on the same requests; per kind
(``generate``: GLIGEN text-box, ``inpaint``: GLIGEN inpainting). Prints the ratio of one run
(the faster of ``--repeats`` alternating repetitions per mode), by wall time and by process CPU
time (less sensitive to other jobs on shared cores).

    .venv/bin/python benchmarks/bench_grounded.py            # ~1-2 minutes on 2 CPU cores

The tiny models are randomly initialised: the numbers measure the machinery, not image quality.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=16, help="requests per kind")
    ap.add_argument("--batch", type=int, default=8, help="items per pipeline call in batched mode")
    ap.add_argument("--steps", type=int, default=10, help="denoising steps (paper: 50)")
    ap.add_argument("--size", type=int, default=64, help="image side (tiny models: 64; paper: 512)")
    ap.add_argument("--repeats", type=int, default=2, help="alternating repetitions (fastest kept)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kinds", nargs="+", default=["generate", "inpaint"], choices=["generate", "inpaint"])
    ap.add_argument("--models", type=Path, default=None,
                    help="folder with tiny gligen/ and gligen_inpaint/ (else built)")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    from counterfactory.generation import grounded as G
    from counterfactory.models import registry, tiny

    torch.set_num_threads(args.threads)
    tmp = tempfile.TemporaryDirectory()
    models = args.models or Path(tmp.name)
    roles = {"generate": "gligen", "inpaint": "gligen_inpaint"}
    for kind in args.kinds:
        if not (models / roles[kind]).exists():
            tiny.build(roles[kind], models)
    cfg = {"models": {roles[k]: {"source": str(models / roles[k])} for k in args.kinds}}
    s = G.GroundedSettings(steps=args.steps, height=args.size, width=args.size, batch_size=args.batch)
    rng = np.random.default_rng(0)
    print(f"torch threads {torch.get_num_threads()}, {args.items} items per kind, {args.steps} steps, "
          f"{args.size}x{args.size}, batch {args.batch} vs 1", flush=True)
    for kind in args.kinds:
        pipe = registry.load(cfg, roles[kind])
        pipe.set_progress_bar_config(disable=True)
        items, sources = [], []
        for i in range(args.items):
            n = 1 + i % 3
            x1 = rng.uniform(0, 0.5, n)
            y1 = rng.uniform(0, 0.5, n)
            boxes = tuple((float(a), float(b), float(a + 0.4), float(b + 0.4)) for a, b in zip(x1, y1))
            items.append(G.GroundedRequest(f"it{i:03d}", kind, f"scene number {i} with objects",
                                           tuple(f"object {j}" for j in range(n)), boxes))
            sources.append(rng.integers(0, 256, (args.size, args.size, 3), dtype=np.uint8))
        seeds = [G.item_seed(0, q.item_id) for q in items]

        def run(bs):
            out = []
            t, c = time.perf_counter(), time.process_time()
            for lo in range(0, len(items), bs):
                src = sources[lo:lo + bs] if kind == "inpaint" else None
                out.append(G.gligen_batch(pipe, s, items[lo:lo + bs], seeds[lo:lo + bs], sources=src))
            return time.perf_counter() - t, time.process_time() - c, np.concatenate(out)

        run(args.batch)  # warm-up
        best = {1: float("inf"), args.batch: float("inf")}
        cpu = dict(best)
        images = {}
        for _ in range(args.repeats):
            for bs in (1, args.batch):
                dt, dc, images[bs] = run(bs)
                best[bs], cpu[bs] = min(best[bs], dt), min(cpu[bs], dc)
        diff = np.abs(images[1].astype(int) - images[args.batch].astype(int))
        one, many = len(items) / best[1], len(items) / best[args.batch]
        print(f"{kind:9s} one item per call: {one:6.2f} images/s | batch {args.batch}: {many:6.2f} images/s | "
              f"ratio {many / one:.2f}x (CPU-time ratio {cpu[1] / cpu[args.batch]:.2f}x) | max pixel difference "
              f"{diff.max()} ({(diff > 0).mean():.4%} of values)", flush=True)
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
