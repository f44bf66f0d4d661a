"""The image stage's two half-precision modes, measured against each other on the same candidates (issue 42 item 7).

COCO-Counterfactuals B.1.2 follows the InstructPix2Pix generator, which runs Prompt-to-Prompt generation and the
CLIP filter under fp16 autocast over fp32 weights: the paper config's ``images.precision: fp16`` with
``images.autocast: true``. ``images.autocast: false`` (ours, an option) casts the weights to fp16 instead. For the
same captions and seeds this prints, per mode: images/s of the batched engine, peak device memory, and how far the
CLIP filter's scores move (sim_0, sim_1, sim_image, sim_direction of every candidate) against an fp32 reference,
with the number of filter decisions (the B.1.2 thresholds) each mode flips.

    .venv/bin/python benchmarks/bench_fp16_autocast.py --device cuda --models resources/models/true_size

``--models`` is a folder with ``sd/``, ``vae/`` and ``clip_filter/`` (``make paper-smoke`` builds true-size ones;
without it the tiny models are built). On a CPU a half precision falls back to fp32 (counterfactory.device), so there the
three modes coincide: a CPU run checks the script, not the precisions. Numbers are measured in one run; the
speed ratio is autocast's images/s over pure fp16's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CAPTIONS = [
    ("b0", "A man riding a horse on the beach.", "A man riding a cow on the beach."),
    ("b1", "Two dogs sitting on a couch.", "Two cats sitting on a couch."),
    ("b2", "A plate of pizza on a table.", "A plate of cake on a table."),
    ("b3", "A red bus parked in the street.", "A red truck parked in the street."),
]
#: the image stage's roles: the generator, the decoding VAE (B.1.2: sd-vae-ft-mse) and the CLIP filter
ROLES = ("sd", "vae", "clip_filter")
SCORES = ("sim_0", "sim_1", "sim_image", "sim_direction")
#: (name, images.precision, images.autocast)
MODES = (("fp32 (reference)", "fp32", True), ("fp16 autocast, fp32 weights (paper)", "fp16", True),
         ("pure fp16 weights (ours, option)", "fp16", False))


def run_mode(cfg_base: dict, precision: str, autocast: bool, captions, candidates: int, batch: int, device: str):
    import torch

    from counterfactory.config import deep_merge
    from counterfactory.filters import ClipScorer
    from counterfactory.generation.engine import make_candidate
    from counterfactory.generation.sampler import build_engine
    from counterfactory.generation.shards import stage_config

    cfg = stage_config(deep_merge(cfg_base, {"images": {"precision": precision, "autocast": autocast}}))
    engine = build_engine(cfg, autocast=autocast)
    scorer = ClipScorer.from_config(cfg, autocast=autocast)
    cuda = device.startswith("cuda") and torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    settings = engine.settings
    jobs = [(cid, o, c, [make_candidate(0, cid, i, settings) for i in range(candidates)]) for cid, o, c in captions]
    engine.generate([jobs[0][1], jobs[0][2]], jobs[0][3][:batch], float_images=True)   # warm-up of the batch shape
    rows, images, seconds = [], 0, 0.0
    for cid, o, c, cands in jobs:
        for s in range(0, len(cands), batch):
            chunk = cands[s:s + batch]
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            res = engine.generate([o, c], chunk, float_images=True)   # the filter scores the decoded images
            if cuda:
                torch.cuda.synchronize()
            seconds += time.perf_counter() - t0
            images += 2 * len(chunk)
            sc = scorer.score_pairs(o, c, res.float_images[:, 0], res.float_images[:, 1])
            for j, cand in enumerate(chunk):
                rows.append({"caption_id": cid, "index": cand.index, **{k: float(sc[k][j]) for k in SCORES}})
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    engine.close()
    return {"images": images, "seconds": seconds, "images_per_s": images / seconds if seconds else None,
            "peak_gib": peak, "rows": rows, "device": str(engine.device), "weights": str(engine.dtype)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", type=Path, default=None, help="folder with sd/, vae/, clip_filter/ (else tiny, built)")
    ap.add_argument("--steps", type=int, default=20, help="denoising steps (paper: 100)")
    ap.add_argument("--resolution", type=int, default=None, help="image side (default: the models' own)")
    ap.add_argument("--captions", type=int, default=2, help="caption pairs (max 4)")
    ap.add_argument("--candidates", type=int, default=16, help="candidates per caption pair (paper: 100)")
    ap.add_argument("--batch", type=int, default=8, help="candidate pairs per UNet call")
    ap.add_argument("--out", type=Path, default=None, help="JSON of every measurement and score")
    args = ap.parse_args(argv)

    from counterfactory.config import load_config
    from counterfactory.filters import FilterThresholds
    from counterfactory.models import tiny

    tmp = None
    models = args.models
    if models is None:
        tmp = tempfile.TemporaryDirectory()
        models = Path(tmp.name)
        for role in ROLES:
            tiny.build(role, models)
    images = {"steps": args.steps, "batch_size": args.batch}
    if args.resolution:
        images.update(height=args.resolution, width=args.resolution)
    base = load_config([REPO / "config" / "demo.yaml"], {
        "device": args.device,
        "models": {role: {"source": str(models / role)} for role in ROLES},
        "images": images})
    # the paper's thresholds (B.1.2), from the paper config's study view
    thresholds = FilterThresholds.from_config(load_config([REPO / "config" / "config.yaml"])["images"]["filter"])
    results = {name: run_mode(base, p, a, CAPTIONS[:args.captions], args.candidates, args.batch, args.device)
               for name, p, a in MODES}
    ref = {(r["caption_id"], r["index"]): r for r in results[MODES[0][0]]["rows"]}

    def passes(r) -> bool:
        return (min(r["sim_0"], r["sim_1"]) >= thresholds.image_caption_min
                and r["sim_image"] >= thresholds.image_image_min and r["sim_direction"] >= thresholds.direction_min)

    first = results[MODES[0][0]]
    print(f"\nbench_fp16_autocast: {args.captions} caption pairs x {args.candidates} candidates, {args.steps} steps, "
          f"batch {args.batch}, device {first['device']}, models {models}")
    print("\n| mode | weights | images/s | peak GiB | max abs shift of sim_0 / sim_1 / sim_image / sim_direction "
          "vs fp32 | filter decisions flipped vs fp32 |")
    print("|---|---|---:|---:|---|---:|")
    summary = {}
    for name, _, _ in MODES:
        r = results[name]
        shifts = {k: max(abs(x[k] - ref[(x["caption_id"], x["index"])][k]) for x in r["rows"]) for k in SCORES}
        flips = sum(passes(x) != passes(ref[(x["caption_id"], x["index"])]) for x in r["rows"])
        summary[name] = {"images_per_s": r["images_per_s"], "peak_gib": r["peak_gib"], "shifts": shifts,
                         "flips": flips, "weights": r["weights"], "n": len(r["rows"])}
        peak = f"{r['peak_gib']:.2f}" if r["peak_gib"] is not None else "n/a"
        print(f"| {name} | {r['weights']} | {r['images_per_s']:.2f} | {peak} | "
              + " / ".join(f"{shifts[k]:.4f}" for k in SCORES) + f" | {flips} of {len(r['rows'])} |")
    auto, pure = (summary[MODES[1][0]]["images_per_s"], summary[MODES[2][0]]["images_per_s"])
    print(f"\nspeed, fp16 autocast / pure fp16: {auto / pure:.2f}x (measured in this run)")
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "summary": summary,
                                        "results": results}, indent=1))
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
