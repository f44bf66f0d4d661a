"""Where the GPU time of the Prompt-to-Prompt and editing stages goes, and what raises their share of the peak
(issue 33, part 3), measured in ONE run on true-size random-weight models (``benchmarks/true_size.py``).

1. **Profile** one batched P2P call (COCO-CF pairs, the paper batch of 8, a few steps) with ``torch.profiler``:
   the share of the wall time the GPU is busy, the busy time by kernel family (attention, matmul, convolution,
   normalisation, element-wise / copies), the host-device synchronisations (``cudaStreamSynchronize``,
   device-to-host copies) and the top CPU-side operators — the time the GPU waits for Python.
2. **Eager rows**, each timed after a warm-up of its own shapes, same items, same steps: P2P pairs at batch 8 (the
   paper config's ``images.batch_size``) and 32; InstructPix2Pix editing (CVLD) at batch 10 (m = 10 per image)
   and 20. The same call is profiled for editing.
3. **Compiled variants** at the largest batch, while the time budget lasts (each one's warm-up reported apart):
   ``torch.compile(fullgraph=True)`` of the UNet in ``reduce-overhead`` mode (one fused graph replayed as CUDA
   graphs: possible since the P2P control traces without a graph break), in ``default`` mode (fused, launched
   kernel by kernel: separates fusion from launch overhead), the production path of ``performance.compile:
   true`` (``counterfactory.device.compile_module``, its graph breaks counted), ``max-autotune`` (autotuned
   kernels; minutes of warm-up), and CUDA graphs with channels-last convolutions.
   Each compiled row compares its images with the eager ones of the same items (max / mean levels of 255).
   Each row: images/s, UNet evaluations/s, achieved TFLOP/s (FLOPs of the UNet alone, so a lower bound of the
   stage), % of the dense bf16 peak, and the ratio to the paper-batch row of its stage.

Batching changes no output: every candidate's noise and parameters derive from its item id
(``generation.selection.make_candidate``), so a larger batch is a pure speed setting.

    python benchmarks/bench_gpu_fastpath.py --out gpu_fastpath.json       # CUDA, bf16: about 7 min on an H200
    python benchmarks/bench_gpu_fastpath.py --out gpu_fastpath.json --variants cudagraphs config_compile \\
        max_autotune --budget-s 540                  # the production path and max-autotune beside CUDA graphs
    OMP_NUM_THREADS=2 python benchmarks/bench_gpu_fastpath.py --device cpu --precision fp32 --resolution 64 \\
        --steps 1 --profile-steps 1 --pairs-batches 1 2 --edit-batches 1 2 --backend eager  # a smoke test (CPU)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_true_size as B  # noqa: E402
import true_size as T  # noqa: E402

KERNEL_FAMILIES = [
    ("attention", re.compile(r"flash|fmha|attention|sdpa|efficient_attention|softmax", re.I)),
    ("matmul", re.compile(r"gemm|cutlass|sm\d+_xmma|cublas|matmul|nvjet", re.I)),
    ("convolution", re.compile(r"conv|implicit|winograd|cudnn|fprop|dgrad", re.I)),
    ("normalisation", re.compile(r"norm", re.I)),
    ("copies", re.compile(r"copy|memcpy|memset|cat|transpose|permute", re.I)),
]


def family(name: str) -> str:
    for fam, pattern in KERNEL_FAMILIES:
        if pattern.search(name):
            return fam
    return "element-wise / other"


def profile_call(run, items, steps: int, device) -> dict:
    """One call under ``torch.profiler``: GPU busy share, busy time by kernel family, host syncs, top CPU ops."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    B.sync(device)
    t = time.perf_counter()
    with profile(activities=acts) as prof:
        run(items, steps)
        B.sync(device)
    wall = time.perf_counter() - t
    from torch.autograd import DeviceType

    by_family: dict[str, float] = defaultdict(float)
    kernels: dict[str, float] = defaultdict(float)
    syncs = d2h = 0
    for ev in prof.events():
        name = ev.name
        if ev.device_type == DeviceType.CUDA:          # a kernel, copy or memset on the GPU
            seconds = ev.device_time_total / 1e6
            by_family[family(name)] += seconds
            kernels[name[:90]] += seconds
            if "DtoH" in name or "Device -> Host" in name:
                d2h += 1
        elif "StreamSynchronize" in name or "DeviceSynchronize" in name or "EventSynchronize" in name:
            syncs += 1
    busy = sum(by_family.values())
    cpu_top = sorted(((ev.key, ev.self_cpu_time_total / 1e6, ev.count) for ev in prof.key_averages()),
                     key=lambda r: -r[1])[:12]
    return {
        "wall_s": wall, "gpu_busy_s": busy, "gpu_busy_fraction": busy / wall if wall else None,
        "busy_by_family_s": dict(sorted(by_family.items(), key=lambda kv: -kv[1])),
        "top_kernels_s": dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:12]),
        "stream_synchronizations": syncs, "device_to_host_copies": d2h,
        "top_cpu_ops_s": [{"op": k, "self_cpu_s": s, "calls": c} for k, s, c in cpu_top],
    }


def timed(run, counted, items, batch: int, steps: int, device) -> dict:
    run(items[:batch], max(1, min(2, steps)))          # warm-up of this batch shape (cudnn benchmark, allocator)
    return B.measure(run, counted, items, batch, steps, device)


def row(stage, batch, m, flops, peak, base_rate=None, **extra) -> dict:
    tflops = flops * m["unet_evals"] / m["wall_s"] / 1e12
    r = {"stage": stage, "batch": batch, "items": m["items"], "images": m["images"], "wall_s": round(m["wall_s"], 3),
         "images_per_s": m["images"] / m["wall_s"], "unet_evals_per_s": m["unet_evals"] / m["wall_s"],
         "tflops": tflops, "peak_fraction": tflops / peak[0] if peak[0] else None, **extra}
    r["ratio_vs_paper_batch"] = r["images_per_s"] / base_rate if base_rate else 1.0
    B.log(f"{stage} batch {batch}{' ' + str(extra) if extra else ''}: {r['images_per_s']:.3f} images/s, "
          f"{r['unet_evals_per_s']:.1f} evals/s, {tflops:.1f} TFLOP/s"
          + (f" = {100 * r['peak_fraction']:.1f} % of peak" if r["peak_fraction"] else "")
          + f", {r['ratio_vs_paper_batch']:.2f}x the paper batch")
    return r


def pixel_change(a: np.ndarray, b: np.ndarray) -> dict:
    """How far two runs' uint8 images of the same items differ (levels of 255)."""
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return {"max_levels": int(d.max()), "mean_levels": float(d.mean())}


#: the variants after the eager rows: name -> (torch.compile mode, channels_last, how), most informative first.
#: how = "forward": ``torch.compile(unet.forward, fullgraph=True)``; "config": the path a run takes with
#: ``performance.compile: true`` (``counterfactory.device.compile_module``: ``module.compile(mode=...)``,
#: graph breaks allowed), to check that the production path reaches the same speed
VARIANTS = {
    "cudagraphs": ("reduce-overhead", False, "forward"),   # one fused graph, replayed as CUDA graphs
    "compile": ("default", False, "forward"),              # one fused graph, launched kernel by kernel
    "config_compile": ("reduce-overhead", False, "config"),  # performance: {compile: true, compile_mode: ...}
    "max_autotune": ("max-autotune", False, "forward"),    # autotuned GEMM / conv kernels + CUDA graphs (slow warm-up)
    "cudagraphs+channels_last": ("reduce-overhead", True, "forward"),
}


def graph_breaks(clear: bool = False) -> int | None:
    """Graph breaks Dynamo has counted (``clear``: start counting again); None where the counter is unavailable."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    n = int(sum(counters["graph_break"].values()))
    if clear:
        counters["graph_break"].clear()
    return n


def compiled_row(out: dict, stage: str, variant: str, unet, vae, run, counted, items, batch: int, steps: int,
                 device, flops, peak, base_rate, reference: np.ndarray | None, backend: str = "inductor") -> None:
    """``torch.compile(fullgraph=True)`` of the UNet's forward in ``variant``'s mode (and layout), warmed up at
    ``batch`` (its time reported apart), timed, its images compared with the eager ones of the same items; then
    the eager forward and layout put back. A failure is recorded, not raised."""
    import torch._dynamo

    mode, channels_last, how = VARIANTS[variant]
    B.log(f"{stage} {variant} (torch.compile mode={mode}, {how}, channels_last={channels_last}), batch {batch}")
    eager = unet.forward
    torch._dynamo.reset()
    graph_breaks(clear=True)
    if channels_last:
        unet.to(memory_format=torch.channels_last)
        vae.to(memory_format=torch.channels_last)
    if how == "config" and backend == "inductor":
        from counterfactory.device import compile_module

        compile_module(unet, mode, device)
    elif how == "config":
        unet.compile(backend=backend)
    else:
        kw = {"mode": mode} if backend == "inductor" else {"backend": backend}
        unet.forward = torch.compile(eager, fullgraph=True, **kw)
    t = time.perf_counter()
    try:
        run(items[:batch], 2)
        run(items[:batch], 2)                          # CUDA graphs record on the second call of a shape
        warm = time.perf_counter() - t
        m = B.measure(run, counted, items[:batch], batch, steps, device)
        extra = {"variant": variant, "compile_mode": mode, "channels_last": channels_last,
                 "compile_warmup_s": round(warm, 1)}
        if reference is not None:
            extra["vs_eager_images"] = pixel_change(run.last, reference)
        if how == "config":
            extra["graph_breaks"] = graph_breaks()
        out["rows"].append(row(stage, batch, m, flops, peak, base_rate, **extra))
    except Exception as err:  # noqa: BLE001 - a benchmark reports, it does not stop
        out[f"error_{stage}_{variant}"] = f"{type(err).__name__}: {err}"[:800]
        B.log(out[f"error_{stage}_{variant}"])
    finally:
        unet.forward = eager
        if getattr(unet, "_compiled_call_impl", None) is not None:
            unet._compiled_call_impl = None            # undo nn.Module.compile
        if channels_last:
            unet.to(memory_format=torch.contiguous_format)
            vae.to(memory_format=torch.contiguous_format)
        torch._dynamo.reset()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", choices=sorted(B.DTYPES), default="bf16")
    ap.add_argument("--steps", type=int, default=20, help="denoising steps of every timed call (paper: 100)")
    ap.add_argument("--profile-steps", type=int, default=6)
    ap.add_argument("--resolution", type=int, default=512)
    ap.add_argument("--pairs-batches", type=int, nargs="+", default=[8, 32],
                    help="eager rows; the first = the paper batch, the last = the batch of the compiled variants")
    ap.add_argument("--edit-batches", type=int, nargs="+", default=[10, 20], help="first = CVLD's m = 10")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS),
                    help="compiled variants, in order; the first runs for both stages before any other")
    ap.add_argument("--variant-cost-s", type=float, default=100.0,
                    help="a variant starts only when the budget has this much left")
    ap.add_argument("--budget-s", type=float, default=430.0, help="wall time after which no variant starts")
    ap.add_argument("--backend", default="inductor",
                    help="torch.compile backend; 'eager' checks the one-graph capture only (a CPU smoke test)")
    ap.add_argument("--out", type=Path, default=None, help="JSON of every measurement")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    device = torch.device(args.device)
    dtype = B.DTYPES[args.precision]
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    peak = B.peak_tflops(device, args.precision, False)
    B.log(f"device {B.device_name(device)}, {args.precision}, peak {peak[0]:.1f} TFLOP/s ({peak[1]}), "
          f"torch {torch.__version__}")
    opts = argparse.Namespace(resolution=args.resolution, channels_last=False, compile=False, compile_mode=None)
    out: dict = {"device": B.device_name(device), "precision": args.precision, "steps": args.steps,
                 "resolution": args.resolution, "peak_tflops": peak[0], "rows": []}

    def save():
        if args.out:
            args.out.write_text(json.dumps(out, indent=2, default=str), encoding="utf-8")

    def left() -> float:
        return args.budget_s - (time.perf_counter() - start)

    stages = {}
    with torch.no_grad():
        # ---------------------------------------------------------------- eager rows and profiles
        for stage, kind, batches, runner in (("p2p_pairs", "sd", args.pairs_batches, B.p2p_stage),
                                             ("editing", "ip2p", args.edit_batches, B.editing_stage)):
            pipe = B.build_model(kind, device, dtype, opts)
            flops = T.unet_flops(kind, args.resolution, args.resolution)
            run, counted, _ = runner(stage, pipe, opts, device, dtype, args.steps)
            items = list(range(max(batches)))
            run(items[:batches[0]], 1)                   # the profiled shape warmed up (cudnn autotuning)
            B.log(f"profiling one batch-{batches[0]} {stage} call of {args.profile_steps} steps")
            out[f"profile_{stage}"] = profile_call(run, items[:batches[0]], args.profile_steps, device)
            B.log(json.dumps({k: v for k, v in out[f"profile_{stage}"].items() if k != "top_cpu_ops_s"},
                             default=str))
            base_rate = None
            for b in batches:
                m = timed(run, counted, items[:b], b, args.steps, device)
                r = row(stage, b, m, flops, peak, base_rate, variant="eager")
                base_rate = base_rate or r["images_per_s"]
                out["rows"].append(r)
                save()
            reference = run.last                         # eager images of items[:batches[-1]]
            stages[stage] = (pipe, run, counted, items, batches[-1], flops, base_rate, reference)
        # ---------------------------------------------------------------- compiled variants, best first
        for variant in args.variants:
            for stage, (pipe, run, counted, items, b, flops, base_rate, reference) in stages.items():
                if left() < args.variant_cost_s:
                    B.log(f"budget: {stage} {variant} not run ({left():.0f} s left)")
                    out.setdefault("not_run", []).append(f"{stage} {variant}")
                    continue
                compiled_row(out, stage, variant, pipe.unet, pipe.vae, run, counted, items, b, args.steps, device,
                             flops, peak, base_rate, reference, args.backend)
                save()
    if device.type == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2 ** 30
    out["total_wall_s"] = time.perf_counter() - start
    save()
    print("\n| stage | batch | variant | images/s | UNet evals/s | TFLOP/s | % of peak | vs paper batch | "
          "vs eager images (max / mean levels) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in out["rows"]:
        pct = f"{100 * r['peak_fraction']:.1f}" if r["peak_fraction"] else "—"
        diff = r.get("vs_eager_images")
        diff = f"{diff['max_levels']} / {diff['mean_levels']:.2f}" if diff else "—"
        print(f"| {r['stage']} | {r['batch']} | {r['variant']} | {r['images_per_s']:.3f} | "
              f"{r['unet_evals_per_s']:.1f} | {r['tflops']:.1f} | {pct} | {r['ratio_vs_paper_batch']:.2f}x | {diff} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
