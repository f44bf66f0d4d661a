"""CVLD editing on the tiny models: InstructPix2Pix images/s batched vs one at a time (same run, ratio printed),
and null-text inversion seconds per image. Small: well under 2 minutes on 2 CPU threads.

    .venv/bin/python benchmarks/bench_editing.py [--threads 2] [--size 64] [--steps 10] [--n 8]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10, help="InstructPix2Pix steps and DDIM inversion steps")
    ap.add_argument("--n", type=int, default=8, help="images (one item's candidates) per ip2p measurement")
    ap.add_argument("--inner", type=int, default=10, help="Adam iterations per null-text step (Mokady et al.: 10)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from diffusers import StableDiffusionInstructPix2PixPipeline, StableDiffusionPipeline

    from counterfactory.generation import editing as ed
    from counterfactory.generation import inversion as inv
    from counterfactory.models import tiny_editing, tiny_vision

    with tempfile.TemporaryDirectory() as tmp:
        tiny_editing.build_editor(Path(tmp) / "editor")
        tiny_vision.build_sd(Path(tmp) / "sd")
        editor = StableDiffusionInstructPix2PixPipeline.from_pretrained(
            Path(tmp) / "editor", safety_checker=None, requires_safety_checker=False)
        sd = StableDiffusionPipeline.from_pretrained(Path(tmp) / "sd", safety_checker=None,
                                                     requires_safety_checker=False)
    editor.set_progress_bar_config(disable=True)
    s = ed.EditSettings(size=args.size, steps=args.steps, inversion_steps=args.steps, inner_steps=args.inner)
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (args.size, args.size, 3)).astype(np.uint8)
    params = [ed.edit_params("bench", j, s, "ip2p") for j in range(args.n)]
    seeds = [p["seed"] for p in params]
    prompt = "turn the man into a woman"

    ed.ip2p_edit(editor, [image], [prompt], seeds[:1], s, params[:1])   # warm-up
    t0 = time.perf_counter()
    ed.ip2p_edit(editor, [image] * args.n, [prompt] * args.n, seeds, s, params)
    batched = time.perf_counter() - t0
    t0 = time.perf_counter()
    for j in range(args.n):
        ed.ip2p_edit(editor, [image], [prompt], seeds[j:j + 1], s, params[j:j + 1])
    single = time.perf_counter() - t0
    print(f"ip2p {args.size}px, {args.steps} steps, {args.threads} threads: batched {args.n / batched:.2f} images/s, "
          f"one at a time {args.n / single:.2f} images/s, ratio {single / batched:.2f}x")

    t0 = time.perf_counter()
    n_inv = 1
    for i in range(n_inv):
        inv.null_text_invert(sd, np.roll(image, i, axis=0), "a photo of a man", s.inversion())
    per = (time.perf_counter() - t0) / n_inv
    print(f"null-text inversion {args.size}px, {args.steps} DDIM steps x {args.inner} Adam iterations: "
          f"{per:.2f} s/image")


if __name__ == "__main__":
    main()
