"""benchmarks/true_size.py: the published architectures have the published sizes, and the FLOP counting
the true-size benchmark relies on gives hand-computed numbers. Models are built on the meta device (no memory,
no compute), so the file runs in seconds."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import true_size as T


def _meta_params(build) -> int:
    with torch.device("meta"):
        return T.n_params(build())


@functools.cache
def _unet_params(variant: str) -> int:
    return _meta_params(lambda: T.unet(variant))


@pytest.mark.parametrize("part, expected", [
    ("unet", 859_520_964),          # SD v1.5 UNet: 859.52 M
    ("vae", 83_653_863),            # SD v1.5 AutoencoderKL: 83.65 M
    ("text_encoder", 123_060_480),  # CLIP ViT-L/14 text tower: 123.06 M
])
def test_published_parameter_counts(part, expected):
    count = _unet_params("sd") if part == "unet" else _meta_params(getattr(T, part))
    assert count == expected


def test_sdxl_parts_have_the_published_sizes():
    """SDXL base 1.0 (the t2i role): UNet 2,567.46 M, second text encoder (OpenCLIP bigG/14 text) 694.66 M; its
    VAE is SD's architecture."""
    assert _unet_params("sdxl") == 2_567_463_684
    assert _meta_params(T.text_encoder_2) == 694_659_840
    assert _meta_params(lambda: T.vae("sdxl")) == 83_653_863


def test_variants_change_only_what_they_should():
    base = _unet_params("sd")
    # extra input channels add 320 * 3 * 3 conv_in weights per channel
    assert _unet_params("ip2p") - base == 4 * 320 * 9
    assert _unet_params("sd_inpaint") - base == 5 * 320 * 9
    gligen = _unet_params("gligen")
    assert _unet_params("gligen_inpaint") - gligen == 5 * 320 * 9
    assert 1.0e9 < gligen < 1.1e9     # gated fusers in all 16 transformer blocks + position net
    assert 50.5e6 < _meta_params(T.big_lama) < 51.5e6   # Big LaMa: 51 M (Suvorov et al. 2022)


def test_flop_counter_matches_a_hand_count_for_a_linear_layer():
    layer = nn.Linear(7, 5)
    x = torch.zeros(3, 7)
    assert T.count_flops(lambda: layer(x)) == 2 * 3 * 7 * 5      # one multiply-add = 2 FLOPs
    conv = nn.Conv2d(2, 4, 3, padding=1)
    img = torch.zeros(1, 2, 6, 6)
    assert T.count_flops(lambda: conv(img)) == 2 * (6 * 6) * 4 * (2 * 3 * 3)


def test_unet_flops_scale_with_pixels_and_variants():
    f512, f256 = T.unet_flops("sd", 512, 512), T.unet_flops("sd", 256, 256)
    assert 7.9e11 < f512 < 8.1e11              # about 0.80 TFLOP per 512x512 evaluation
    assert 4 * f256 < f512 < 4.6 * f256         # convolutions scale with pixels, self-attention faster
    # ip2p: only conv_in is wider: 4 more input channels x 320 outputs x 9 taps x 64x64 latent positions x 2
    assert T.unet_flops("ip2p", 512, 512) - f512 == 2 * 64 * 64 * 320 * 4 * 9


def test_sdxl_flops_exceed_sd_as_its_size_says():
    """At the same 512x512 an SDXL evaluation costs several SD ones (3x the parameters, 2048-wide text); at its
    native 1024x1024 about 4x its 512x512 cost or more (convolutions scale with pixels, attention faster)."""
    sd, xl, xl_hd = T.unet_flops("sd", 512, 512), T.unet_flops("sdxl", 512, 512), T.unet_flops("sdxl", 1024, 1024)
    assert 1.5 * sd < xl < 3 * sd
    assert 4 * xl <= xl_hd < 5 * xl


def test_counting_rows_counts_batch_entries():
    layer = nn.Linear(2, 2)
    with T.counting_rows(layer) as rows:
        layer(torch.zeros(3, 2))
        layer(torch.zeros(1, 2))
    layer(torch.zeros(5, 2))                     # after the block: not counted
    assert rows[0] == 4


def test_big_lama_keeps_unmasked_pixels_and_shapes():
    torch.manual_seed(0)
    net = T.BigLaMa(ngf=8, n_blocks=1)           # the architecture, small
    net.eval()
    image = torch.rand(2, 3, 32, 40)
    mask = torch.zeros(2, 1, 32, 40)
    mask[:, :, 8:16, 8:24] = 1
    with torch.no_grad():
        out = net(image, mask.long())
    assert out.shape == image.shape
    assert torch.equal(out[mask.expand_as(out) == 0], image[mask.expand_as(image) == 0])
    assert not torch.allclose(out[:, :, 8:16, 8:24], image[:, :, 8:16, 8:24])


# --------------------------------------------------------------------------- `make paper-smoke` (issue 33 part 1)

def _paper_smoke_script():
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("paper_smoke_script", root / "scripts" / "paper_smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_paper_smoke_overlay_validates_and_every_paper_role_has_a_true_size_builder():
    """config/config.yaml + config/paper_smoke.yaml is a valid config; every model role of the paper config
    (new roles included) has a true-size builder and the overlay points it at that builder's folder -- so a
    role added to the paper config without a builder fails here, not hours into `make paper-smoke`."""
    from counterfactory.config import deep_merge, read_yaml, validate_config

    root = Path(__file__).resolve().parents[1]
    paper = read_yaml(root / "config" / "config.yaml")
    overlay = read_yaml(root / "config" / "paper_smoke.yaml")
    cfg = validate_config(deep_merge(paper, overlay), source="config/paper_smoke.yaml")
    script = _paper_smoke_script()
    assert set(script.ORDER) == set(script.BUILDERS)
    out = "resources/models/true_size"
    for role, entry in paper["models"].items():
        folder = script.SHARED.get(role, role)
        assert folder in script.BUILDERS, f"models.{role}: no true-size builder in scripts/paper_smoke.py"
        spec = cfg["models"][role]
        if role in script.RELEASED_FILES:       # a released checkpoint file of an open_clip architecture
            assert spec["pretrained"] == f"{out}/{role}/{script.RELEASED_FILES[role]}"
            assert spec["source"] == entry["source"]
        else:
            assert spec["source"] == f"{out}/{folder}", role
    # the overlay cuts sizes but keeps the paper's studies and models
    assert cfg["studies"] == paper["studies"]
    assert cfg["run_name"] == "paper_smoke"


def test_paper_smoke_vocabulary_padding_keeps_ids_and_reaches_the_true_size():
    script = _paper_smoke_script()
    vocab = script._pad_vocab({"<s>": 0, "a": 1, "<unused0>": 2}, 6)
    assert len(vocab) == 6 and sorted(vocab.values()) == list(range(6))
    assert vocab["<s>"] == 0 and vocab["a"] == 1 and vocab["<unused0>"] == 2


def test_paper_smoke_bridgetower_processor_takes_photos_of_any_shape():
    """The true-size run found Table 5's BridgeTower ITR failing inside transformers on the first image: the smoke
    folder's processor carried a height/width crop size, which BridgeTower's processor cannot read. The builder
    now writes the hub repository's settings; landscape, portrait and tiny photos all come out 288 x 288."""
    from PIL import Image

    processor = _paper_smoke_script().bridgetower_image_processor()
    images = [Image.new("RGB", size, (i * 60, 90, 30)) for i, size in enumerate([(640, 480), (375, 500), (64, 64)])]
    out = processor(images=images, return_tensors="pt")
    assert tuple(out["pixel_values"].shape) == (3, 3, 288, 288)
    assert tuple(out["pixel_mask"].shape) == (3, 288, 288)
    assert processor.to_dict()["size"] == {"shortest_edge": 288}


# --------------------------------------------------------------------------- bench_gpu_fastpath's compiled rows

def _toy_stage():
    net, vae = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)

    def run(items, steps):
        x = torch.ones(len(items), 4, 2, 2)
        for _ in range(steps):
            x = net(x)
        run.last = (x.detach().clamp(0, 1) * 255).round().to(torch.uint8).numpy()
        return len(items)

    return net, vae, run


def test_fastpath_compiled_row_compares_images_and_puts_the_eager_model_back():
    """A compiled variant is timed, compared with the eager images of the same items, and leaves the model as it
    found it (eager forward, contiguous layout); a variant that fails is recorded, not raised."""
    import bench_gpu_fastpath as F

    net, vae, run = _toy_stage()
    eager_forward = net.forward
    with torch.no_grad():
        run([0, 1], 3)
        reference = run.last.copy()
        out = {"rows": []}
        F.compiled_row(out, "toy", "compile", net, vae, run, net, [0, 1], 2, 3, torch.device("cpu"), 1e9,
                       (1e3, "test"), 1.0, reference, backend="eager")
    row, = out["rows"]
    assert row["variant"] == "compile" and row["vs_eager_images"] == {"max_levels": 0, "mean_levels": 0.0}
    assert row["images"] == 2 and row["unet_evals_per_s"] > 0 and net.forward == eager_forward

    def broken(items, steps):
        assert not net.weight.is_contiguous()           # the variant's channels-last layout is in place
        raise RuntimeError("no CUDA graphs here")

    F.compiled_row(out, "toy", "cudagraphs+channels_last", net, vae, broken, net, [0, 1], 2, 3,
                   torch.device("cpu"), 1e9, (1e3, "test"), 1.0, reference, backend="eager")
    assert "no CUDA graphs here" in out["error_toy_cudagraphs+channels_last"] and len(out["rows"]) == 1
    assert net.forward == eager_forward and net.weight.is_contiguous() and vae.weight.is_contiguous()
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.no_grad():                               # the production path (performance.compile: module.compile)
        F.compiled_row(out, "toy", "config_compile", net, vae, run, net, [0, 1], 2, 3, torch.device("cpu"), 1e9,
                       (1e3, "test"), 1.0, reference, backend=counting)
    config_row = out["rows"][-1]
    assert config_row["variant"] == "config_compile" and config_row["vs_eager_images"]["max_levels"] == 0
    assert graphs, "the module was not compiled"
    assert config_row["graph_breaks"] == 0 and net._compiled_call_impl is None and net.forward == eager_forward
    shifted = reference.copy()
    shifted.flat[0] = 255 - shifted.flat[0]
    assert F.pixel_change(shifted, reference)["max_levels"] == abs(255 - 2 * int(reference.flat[0]))
