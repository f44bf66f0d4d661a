"""Benchmark of batched counterfactual-set generation (SocialCounterfactuals §3.3) on the tiny SD, CPU.

Compares images/s of
  * one image pair per UNet call ([base, counterfactual], one candidate: 2 images per call),
  * one whole set per call (base + 11 counterfactuals = 12 members, one candidate: 12 images per call),
  * several sets per call (``--sets-per-call`` candidates of the 12-member set),
on the same candidates, and prints the ratios from this one run. The pair loop also needs 11 calls (22
images, the base regenerated 11 times) for the 12 distinct images of one candidate set; its "distinct set
images/s" column counts those 12.

    .venv/bin/python benchmarks/bench_sets.py          # ~1-2 minutes on 2 idle CPU cores

The tiny model is randomly initialised: the numbers measure the machinery, not image quality.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

RACES = ["White", "Black", "Indian", "Asian", "Middle Eastern", "Latino"]
GENDERS = ["male", "female"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5, help="denoising steps (demo: 5)")
    ap.add_argument("--size", type=int, default=64, help="image side (demo: 64)")
    ap.add_argument("--candidates", type=int, default=8, help="candidate sets generated per mode and repetition")
    ap.add_argument("--sets-per-call", type=int, nargs="+", default=[4, 8], help="candidate sets per UNet call")
    ap.add_argument("--repeats", type=int, default=3, help="alternating repetitions (the fastest is kept)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", type=Path, default=None, help="folder with a tiny sd/ (else built)")
    args = ap.parse_args(argv)

    import torch
    from diffusers import StableDiffusionPipeline

    from counterfactory.generation.sampler import GenerationSettings, P2PEngine
    from counterfactory.generation.selection import make_candidate
    from counterfactory.models import tiny

    torch.set_num_threads(args.threads)
    tmp = None
    models = args.models
    if models is None:
        tmp = tempfile.TemporaryDirectory()
        models = Path(tmp.name)
        tiny.build("sd", models)
    pipe = StableDiffusionPipeline.from_pretrained(models / "sd", safety_checker=None, requires_safety_checker=False)
    settings = GenerationSettings(steps=args.steps, height=args.size, width=args.size)
    engine = P2PEngine(pipe, settings)
    members = [f"A photo of a {r} {g} doctor" for r in RACES for g in GENDERS]     # (race, gender): 12 members
    g = len(members)
    cands = [make_candidate(0, "bench_set", i, settings) for i in range(args.candidates)]

    def pairs() -> int:
        n = 0
        for c in cands:
            for edit in members[1:]:
                n += engine.generate([members[0], edit], [c]).images[0].shape[0]
        return n

    def sets(per_call: int) -> int:
        n = 0
        for s in range(0, len(cands), per_call):
            res = engine.generate(members, cands[s:s + per_call])
            n += res.images.shape[0] * res.images.shape[1]
        return n

    modes = {"pair": pairs, "set x1": lambda: sets(1)}
    for k in args.sets_per_call:
        modes[f"set x{k}"] = (lambda k=k: sets(k))
    for fn in modes.values():                                     # warm-up every batch shape
        fn()
    # alternate the modes and keep each one's fastest repetition (robust to other load on the machine);
    # this process's CPU time is reported too, as it is less sensitive to other processes
    best: dict[str, tuple[float, int]] = {}
    cpu: dict[str, float] = {}
    for _ in range(args.repeats):
        for name, fn in modes.items():
            t0, c0 = time.perf_counter(), time.process_time()
            images = fn()
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if name not in best or dt < best[name][0]:
                best[name] = (dt, images)
            cpu[name] = min(cpu.get(name, dc), dc)
    engine.close()

    pw, pn = best["pair"]
    pair_rate = pn / pw
    distinct_pair_rate = g * len(cands) / pw
    print(f"\nbench_sets: tiny SD, {args.size}x{args.size}, {args.steps} steps, control={settings.control}, "
          f"{g}-member set, {len(cands)} candidate sets per mode, torch threads={args.threads}, device=cpu, "
          f"best of {args.repeats} alternating runs")
    print("\n| mode | images per UNet call | images made | wall s | images/s | distinct set images/s | "
          "images/s vs one pair per call | CPU s | images/CPU-s vs one pair per call |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    pair_cpu_rate = pn / cpu["pair"]
    print(f"| one pair per call (11 calls per candidate set) | 2 | {pn} | {pw:.2f} | {pair_rate:.1f} | "
          f"{distinct_pair_rate:.1f} | 1.00x | {cpu['pair']:.2f} | 1.00x |")
    for name, (w, n) in best.items():
        if name == "pair":
            continue
        k = int(name.split("x")[1])
        print(f"| {k} whole set(s) per call | {k * g} | {n} | {w:.2f} | {n / w:.1f} | {n / w:.1f} | "
              f"{(n / w) / pair_rate:.2f}x | {cpu[name]:.2f} | {(n / cpu[name]) / pair_cpu_rate:.2f}x |")
    k = max(args.sets_per_call)
    w, n = best[f"set x{k}"]
    print(f"\nratio, images/s of {k} sets of {g} per call / one pair per call: {(n / w) / pair_rate:.2f}x "
          f"(distinct set images: {(n / w) / distinct_pair_rate:.2f}x; per CPU second: "
          f"{(n / cpu[f'set x{k}']) / pair_cpu_rate:.2f}x)")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
