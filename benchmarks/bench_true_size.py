"""Speed of the image stages at true model size, without weights (issue 16).

Each stage's own code runs on the published architectures with random weights (``benchmarks/true_size.py``:
SD v1.5 UNet 859.5 M, VAE 83.7 M, CLIP ViT-L/14 text 123.1 M parameters; GLIGEN; InstructPix2Pix; Big LaMa),
once batched as the stage runs it and once as a one-item-per-call loop, on the same items, in one process:

==============  ==========================================================  ======================  =====
stage           code driven                                                 item (images per item)  batch
==============  ==========================================================  ======================  =====
p2p_pairs       ``generation.sampler.P2PEngine.generate`` (COCO-CF §3.2)     one candidate pair (2)     8
p2p_sets        the same with a 12-member set (SocialCF §3.3)                one candidate set (12)     2
gligen          ``generation.grounded.gligen_batch`` (CounterCurate §3.2)    one request (1)            4
gligen_inpaint  the same with source images (CounterCurate §3.3)             one request (1)            4
editing         ``generation.editing.ip2p_edit`` (CVLD §3.3)                 one edit candidate (1)    10
null_text_inv   ``generation.inversion.null_text_invert`` (CVLD §3.3)        one image (0)              1
null_text_edit  ``generation.inversion.p2p_edit`` of an inverted image       one edit candidate (1)    10
t2i             ``generation.grounded.t2i_batch`` on SDXL (CounterCurate     one request (1)            4
                §3.4, DALLE-3's role; 1024x1024 by default)
inpainting      ``generation.inpaint.fill_batch`` with Big LaMa (§3.1)       one image (1)              8
==============  ==========================================================  ======================  =====

Null-text inversion optimises one image's null embeddings (no batched form: one mode is timed); its evaluations
include the ``inner_steps`` optimisation forwards (at most 10 per step; Mokady et al.'s early stop can end them
sooner), each followed by a backward pass to the embedding that the FLOP figure does not count (so its TFLOP/s
is a lower bound by up to about 2x). ``null_text_edit`` samples the m = 10 Prompt-to-Prompt candidates of one
inverted image (an inversion without optimisation is made before the timing).

Batches are the paper config's (``images.batch_size``, ``grounded``, ``editing`` m, ``inpaint.batch_size``);
``--batch-size`` overrides them all. Measured per mode: images/s; UNet evaluations/s, where **one UNet
evaluation is one latent row through the UNet** (a forward on B rows counts B; classifier-free guidance
doubles the rows, InstructPix2Pix triples them; counted with a forward hook; for inpainting: LaMa
forwards of one image); FLOPs of one evaluation of one row, counted by ``torch.utils.flop_counter``
on the meta device (model FLOPs: matmuls, convolutions, attention; not norms or FFTs); achieved TFLOP/s =
FLOPs x evaluations / wall time of the whole stage call (text encoding, VAE and sampler included, so
it is a lower bound of the UNet's own rate); its share of the device's peak for the dtype (dense tensor-core
peak from the data sheet on known GPUs; on CPU a measured large matmul in the same dtype, labelled
"measured matmul").

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_true_size.py --steps 1 --resolution 256   # CPU, minutes
    .venv/bin/python benchmarks/bench_true_size.py --device cuda --precision bf16 --json out.json  # paper steps

Defaults: on CUDA the paper's steps (100 P2P / editing, 50 GLIGEN) and batches at 512x512 with a warm-up of
both modes (2 steps); on CPU 2 steps, batches of at most 2 and a one-item warm-up (1 step). Items per
mode: the batch size (inpainting on CUDA: 8 batches). At small latents the UNet reads its 3.4 GB of fp32
weights per call, so CPU rates at low resolution say little about a GPU. Measured: the CPU command above
took 19 min on 2 shared cores; the CUDA command 3.5 min on an H100 (most of it the one-item loops).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import true_size as T  # noqa: E402

#: stage -> model, paper batch, paper steps, images per item
STAGES = {
    "p2p_pairs": ("sd", 8, 100, 2),        # COCO-CF B.1.2 / reference code: 100 Euler-ancestral steps
    "p2p_sets": ("sd", 2, 100, 12),        # SocialCF §3.3: InstructPix2Pix's generator, 12-member sets
    "gligen": ("gligen", 4, 50, 1),        # CounterCurate: GLIGEN inference, 50 steps
    "gligen_inpaint": ("gligen_inpaint", 4, 50, 1),
    "editing": ("ip2p", 10, 100, 1),       # CVLD §5.1 m = 10; InstructPix2Pix default 100 steps
    "null_text_inv": ("sd", 1, 50, 0),     # CVLD §3.3: null-text inversion, 50 DDIM steps x <= 10 iterations
    "null_text_edit": ("sd", 10, 50, 1),   # CVLD §3.3/§5.1: m = 10 P2P edits of one inverted image
    "t2i": ("sdxl", 4, 50, 1),             # CounterCurate §3.4: SDXL base in DALLE-3's role, grounded settings
    "inpainting": ("lama", 8, 1, 1),       # spurious retrieval §3.1; one forward per image
}
#: paper image side of a stage when --resolution is not given (t2i: DALLE-3 "hd", CounterCurate §4.1)
PAPER_RESOLUTION = {"t2i": 1024}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: dense peak TFLOP/s from NVIDIA's data sheets: (name substring, {dtype: peak}); H200 = H100 SXM compute
GPU_PEAKS = [
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
]
RACES = ["White", "Black", "Indian", "Asian", "Middle Eastern", "Latino"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_tflops(device: torch.device, precision: str, tf32: bool) -> tuple[float | None, str]:
    """(peak TFLOP/s, label): the data-sheet dense peak of a known GPU, else a measured matmul."""
    key = "tf32" if precision == "fp32" and tf32 else precision
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for sub, peaks in GPU_PEAKS:
            if sub in name:
                return peaks[key], f"{name} {key} dense (data sheet)"
    n, dtype = 2048, DTYPES[precision]
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(4):
        sync(device)
        t = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t)
    label = f"{device.type} {precision} measured matmul {n}^3 ({torch.get_num_threads()} threads)"
    return 2 * n ** 3 / best / 1e12, label


def apply_options(module: torch.nn.Module, args) -> torch.nn.Module:
    """The fast-path options, with plain torch calls: channels-last memory format; ``torch.compile`` of the
    forward (the module's ``__call__`` and hooks stay eager, so the evaluation counter still sees every call)."""
    if args.channels_last:
        module.to(memory_format=torch.channels_last)
    if args.compile:
        module.forward = torch.compile(module.forward, mode=args.compile_mode)
    return module


# --------------------------------------------------------------------------- stages: (run(items), counted module)

def p2p_stage(stage: str, pipe, args, device, dtype, steps: int):
    from counterfactory.generation.sampler import GenerationSettings, P2PEngine
    from counterfactory.generation.selection import make_candidate

    r = stage_resolution(stage, args)
    settings = GenerationSettings(steps=steps, height=r, width=r)
    engine = P2PEngine(pipe, settings, device, dtype)
    if stage == "p2p_pairs":
        prompts = ["A man riding a horse on the beach.", "A man riding a cow on the beach."]
    else:
        prompts = [f"A photo of a {r} {g} doctor" for r in RACES for g in ("male", "female")]

    def run(items, n_steps):
        engine.settings = dataclasses.replace(settings, steps=n_steps)
        res = engine.generate(prompts, [make_candidate(0, "bench", i, settings) for i in items])
        run.last = res.images                  # the last call's images, for output comparisons
        return res.images.shape[0] * res.images.shape[1]

    return run, engine.unet, engine.close


def gligen_stage(stage: str, pipe, args, device, dtype, steps: int):
    from counterfactory.generation import grounded as G

    inpaint = stage == "gligen_inpaint"
    r = stage_resolution(stage, args)
    s = G.GroundedSettings(steps=steps, height=r, width=r)
    rng = np.random.default_rng(0)
    source = rng.integers(0, 256, (r, r, 3), dtype=np.uint8)

    def request(i):
        n = 1 + i % 3
        boxes = tuple((0.1 * j, 0.1 * j, 0.1 * j + 0.4, 0.1 * j + 0.5) for j in range(n))
        return G.GroundedRequest(f"it{i:03d}", "inpaint" if inpaint else "generate",
                                 f"a street scene number {i} with {n} objects",
                                 tuple(f"object {j}" for j in range(n)), boxes)

    def run(items, n_steps):
        reqs = [request(i) for i in items]
        seeds = [G.item_seed(0, q.item_id) for q in reqs]
        out = G.gligen_batch(pipe, dataclasses.replace(s, steps=n_steps), reqs, seeds,
                             sources=[source] * len(reqs) if inpaint else None)
        return len(out)

    return run, pipe.unet, None


def editing_stage(stage: str, pipe, args, device, dtype, steps: int):
    from counterfactory.generation import editing as ed

    r = stage_resolution(stage, args)
    s = ed.EditSettings(size=r, steps=steps)
    image = np.random.default_rng(0).integers(0, 256, (r, r, 3), dtype=np.uint8)

    def run(items, n_steps):
        params = [ed.edit_params("bench", j, s, "ip2p") for j in items]
        out = ed.ip2p_edit(pipe, [image] * len(items), ["turn the man into a woman"] * len(items),
                           [p["seed"] for p in params], dataclasses.replace(s, steps=n_steps), params)
        run.last = np.stack(out)               # the last call's images, for output comparisons
        return len(out)

    return run, pipe.unet, None


def null_text_stage(stage: str, pipe, args, device, dtype, steps: int):
    from counterfactory.generation import editing as ed
    from counterfactory.generation import inversion as inv

    r = stage_resolution(stage, args)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (r, r, 3), dtype=np.uint8) for _ in range(4)]
    prompts = ("a photo of a man riding a bicycle", "a photo of a woman riding a bicycle")

    def settings(n_steps, inner):
        return inv.InversionSettings(steps=n_steps, inner_steps=inner, size=r)

    if stage == "null_text_inv":
        def run(items, n_steps):
            with torch.enable_grad():     # the optimisation differentiates through the UNet
                for i in items:
                    inv.null_text_invert(pipe, images[i % len(images)], prompts[0], settings(n_steps, 10))
            return 0                      # no image is written: the inversion is an intermediate
        return run, pipe.unet, None

    inverted = {steps: inv.null_text_invert(pipe, images[0], prompts[0], settings(steps, 0))}
    es = ed.EditSettings(size=r, inversion_steps=steps)

    def run(items, n_steps):
        if n_steps not in inverted:
            inverted[n_steps] = inv.null_text_invert(pipe, images[0], prompts[0], settings(n_steps, 0))
        params = [ed.edit_params("bench", j, es, "null_text") for j in items]
        return len(inv.p2p_edit(pipe, inverted[n_steps], *prompts, params))

    return run, pipe.unet, None


def t2i_stage(stage: str, pipe, args, device, dtype, steps: int):
    from counterfactory.generation import grounded as G

    r = stage_resolution(stage, args)
    s = G.GroundedSettings(steps=steps, t2i_height=r, t2i_width=r)

    def run(items, n_steps):
        reqs = [G.GroundedRequest(f"t{i:03d}", "t2i", f"a red car parked next to blue house number {i}")
                for i in items]
        out = G.t2i_batch(pipe, dataclasses.replace(s, steps=n_steps), reqs,
                          [G.item_seed(0, q.item_id) for q in reqs])
        return len(out)

    return run, pipe.unet, None


def inpainting_stage(stage: str, net, args, device, dtype, steps: int):
    from counterfactory.generation import inpaint as I

    rng = np.random.default_rng(0)
    r = stage_resolution(stage, args)
    images = [rng.integers(0, 256, (r, r, 3), dtype=np.uint8) for _ in range(64)]
    masks = [I.boxes_to_mask([[r // 8 + i % 8, r // 4, r // 2 + i % 8, 3 * r // 4]], r, r) for i in range(64)]

    def run(items, n_steps):
        items = list(items)
        out = I.fill_batch([images[i % 64] for i in items], [masks[i % 64] for i in items], "lama", model=net,
                           batch_size=len(items))
        return len(out)

    return run, net, None


RUNNERS = {"p2p_pairs": p2p_stage, "p2p_sets": p2p_stage, "gligen": gligen_stage, "gligen_inpaint": gligen_stage,
           "editing": editing_stage, "null_text_inv": null_text_stage, "null_text_edit": null_text_stage,
           "t2i": t2i_stage, "inpainting": inpainting_stage}


def stage_resolution(stage: str, args) -> int:
    """``--resolution`` when given, else the stage's paper resolution (512; t2i 1024)."""
    return args.resolution or PAPER_RESOLUTION.get(stage, 512)


def build_model(kind: str, device, dtype, args):
    if kind == "lama":
        with torch.device(device):
            net = T.big_lama()
        net.to(device, dtype)
        apply_options(net, args)
        return net
    pipe = T.pipeline(kind, device, dtype)
    apply_options(pipe.unet, args)
    if args.channels_last:
        pipe.vae.to(memory_format=torch.channels_last)
    return pipe


# --------------------------------------------------------------------------- measuring

def measure(run, counted, items: list[int], per_call: int, steps: int, device) -> dict:
    """Wall time, images and counted rows of running ``items`` ``per_call`` at a time."""
    with T.counting_rows(counted) as rows:
        sync(device)
        t = time.perf_counter()
        images = sum(run(items[lo:lo + per_call], steps) for lo in range(0, len(items), per_call))
        sync(device)
        wall = time.perf_counter() - t
    return {"wall_s": wall, "images": images, "unet_evals": rows[0], "items": len(items)}


def bench_stage(stage: str, model, args, device, dtype, peak: tuple[float | None, str]) -> list[dict]:
    kind, paper_batch, paper_steps, per_item = STAGES[stage]
    batch = args.batch_size or (paper_batch if device.type == "cuda" else min(paper_batch, 2))
    steps = 1 if stage == "inpainting" else (args.steps or (paper_steps if device.type == "cuda" else 2))
    # LaMa is one forward per image: on a GPU 8 batches, so the timed span is not a few milliseconds
    n_items = args.items or (8 * batch if stage == "inpainting" and device.type == "cuda" else batch)
    items = list(range(n_items))
    run, counted, close = RUNNERS[stage](stage, model, args, device, dtype, steps)
    res = stage_resolution(stage, args)
    flops = T.lama_flops(res, res) if stage == "inpainting" else T.unet_flops(kind, res, res)
    warm = args.warmup_steps if args.warmup_steps is not None else (2 if device.type == "cuda" else 1)
    log(f"{stage}: {n_items} items x {per_item} images, {steps} steps, batch {batch} vs 1; "
        f"{flops / 1e9:.1f} GFLOP per evaluation; warm-up ({warm} steps)")
    with torch.no_grad():
        if warm:
            run(items[:1], warm)
            if device.type == "cuda" or args.compile:      # every batch shape the timing uses
                run(items[:batch], warm)
        modes = {}
        # a stage with no batched form (null-text inversion) is timed once, one item per call
        for name, per_call in ((f"batch {batch}", batch), ("one item per call", 1))[1 if batch == 1 else 0:]:
            log(f"{stage}: timing {name}")
            modes[name] = measure(run, counted, items, per_call, steps, device)
    if close:
        close()
    rows = []
    loop_rate = modes["one item per call"]["items"] / modes["one item per call"]["wall_s"]
    for name, m in modes.items():
        tflops = flops * m["unet_evals"] / m["wall_s"] / 1e12
        rows.append({
            "stage": stage, "mode": name, "batch": batch if name.startswith("batch") else 1, "items": n_items,
            "images": m["images"], "steps": steps, "resolution": res, "precision": args.precision,
            "tf32": bool(args.tf32), "channels_last": bool(args.channels_last), "compile": bool(args.compile),
            "device": device_name(device), "wall_s": m["wall_s"], "images_per_s": m["images"] / m["wall_s"],
            "items_per_s": m["items"] / m["wall_s"],
            "unet_evals": m["unet_evals"], "unet_evals_per_s": m["unet_evals"] / m["wall_s"],
            "gflop_per_eval": flops / 1e9, "tflops": tflops, "peak_tflops": peak[0], "peak_label": peak[1],
            "peak_fraction": tflops / peak[0] if peak[0] else None,
            "speedup_vs_one_per_call": (m["items"] / m["wall_s"]) / loop_rate,
        })
        log(f"{stage} {name}: {rows[-1]['images_per_s']:.3f} images/s ({rows[-1]['items_per_s']:.4f} items/s), "
            f"{rows[-1]['unet_evals_per_s']:.2f} evals/s, "
            f"{tflops:.3f} TFLOP/s")
    return rows


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"


def markdown(rows: list[dict]) -> str:
    head = ("| stage | mode | images | steps | res | dtype | ch-last | compile | wall s | images/s | items/s "
            "| UNet evals/s | GFLOP/eval | TFLOP/s | % of peak | vs one/call |")
    lines = [head, "|" + "---|" * 2 + "---:|" * 14]
    for r in rows:
        pct = f"{100 * r['peak_fraction']:.1f}" if r["peak_fraction"] is not None else "-"
        lines.append(
            f"| {r['stage']} | {r['mode']} | {r['images']} | {r['steps']} | {r['resolution']} | {r['precision']}"
            f"{'+tf32' if r['tf32'] else ''} | {'yes' if r['channels_last'] else 'no'} | "
            f"{'yes' if r['compile'] else 'no'} | {r['wall_s']:.2f} | {r['images_per_s']:.3f} | "
            f"{r['items_per_s']:.4f} | {r['unet_evals_per_s']:.2f} | {r['gflop_per_eval']:.1f} | {r['tflops']:.3f} | {pct} | "
            f"{r['speedup_vs_one_per_call']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    ap.add_argument("--precision", choices=sorted(DTYPES), default="fp32")
    ap.add_argument("--tf32", action="store_true", help="fp32 matmuls/convolutions on TF32 tensor cores (peak: tf32)")
    ap.add_argument("--channels-last", action="store_true", help="UNet, VAE (and LaMa) in channels-last format")
    ap.add_argument("--compile", action="store_true", help="torch.compile the UNet's (LaMa's) forward")
    ap.add_argument("--compile-mode", default=None, help="torch.compile mode (default, reduce-overhead, ...)")
    ap.add_argument("--batch-size", type=int, default=None, 
                    help="items per call in batched mode (default: paper on CUDA, at most 2 on CPU)")
    ap.add_argument("--items", type=int, default=None, help="items per mode (default: the batch size)")
    ap.add_argument("--steps", type=int, default=None, help="denoising steps (default: paper on CUDA, 2 on CPU)")
    ap.add_argument("--warmup-steps", type=int, default=None, help="steps of the warm-up calls (0: none)")
    ap.add_argument("--resolution", type=int, default=None,
                    help="image side of every stage (default: the paper's, 512; t2i 1024)")
    ap.add_argument("--stages", nargs="+", choices=list(STAGES), default=list(STAGES))
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--json", type=Path, default=None, help="write all rows here as JSON")
    args = ap.parse_args(argv)
    if args.resolution is not None and args.resolution % 64:
        ap.error("--resolution must be a multiple of 64 (VAE x UNet down-sampling)")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)
    torch.backends.cudnn.allow_tf32 = bool(args.tf32)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    dtype = DTYPES[args.precision]
    torch.manual_seed(0)
    peak = peak_tflops(device, args.precision, args.tf32)
    log(f"device {device_name(device)}, {args.precision}{' + tf32' if args.tf32 else ''}, peak "
        f"{peak[0]:.2f} TFLOP/s ({peak[1]}), torch {torch.__version__}, OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', '-')}")
    rows: list[dict] = []
    model, model_kind = None, None
    for stage in args.stages:
        kind = STAGES[stage][0]
        if kind != model_kind:
            model = None
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            log(f"building true-size {kind} with random weights")
            t = time.perf_counter()
            model, model_kind = build_model(kind, device, dtype, args), kind
            log(f"built in {time.perf_counter() - t:.1f} s")
        rows += bench_stage(stage, model, args, device, dtype, peak)
        if args.json:
            from counterfactory.io import write_json

            write_json(args.json, {"rows": rows})
    table = markdown(rows)
    print("\n" + table, flush=True)
    if device.type == "cuda":
        print(f"\npeak GPU memory {torch.cuda.max_memory_allocated(device) / 2 ** 30:.1f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
