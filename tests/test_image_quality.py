"""§10.3's image quality (issue 42 item 6): FID and IS through torchmetrics over the inception role's features,
checked against the textbook formulas on decisive inputs; the role's loader; the table command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import linalg

from counterfactory.cli import main
from counterfactory.errors import ModelLoadError
from counterfactory.evaluation import image_quality as iq
from counterfactory.models import inception

REPO = Path(__file__).resolve().parents[1]


def _fid_reference(a: np.ndarray, b: np.ndarray) -> float:
    """Heusel et al. (2017): |mu_a - mu_b|^2 + Tr(S_a + S_b - 2 (S_a S_b)^1/2), unbiased covariances."""
    mu_a, mu_b = a.mean(0), b.mean(0)
    s_a, s_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    covmean = linalg.sqrtm(s_a @ s_b).real
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(s_a + s_b - 2 * covmean))


def test_fid_is_the_frechet_distance_of_the_two_gaussians():
    rng = np.random.default_rng(0)
    a = rng.normal(0.0, 1.0, (400, 8))
    b = rng.normal(0.5, 2.0, (300, 8)) @ rng.normal(size=(8, 8))
    assert iq.fid(a, b) == pytest.approx(_fid_reference(a, b), rel=1e-6)
    assert iq.fid(a, a) == pytest.approx(0.0, abs=1e-6)
    # a pure shift by d in every coordinate: FID = d^2 * dims
    assert iq.fid(a + 3.0, a) == pytest.approx(9.0 * 8, rel=1e-9)
    with pytest.raises(Exception, match="2 or more"):
        iq.fid(a[:1], b)


def test_inception_score_counts_the_confidently_predicted_classes():
    confident = np.full((12, 6), -50.0)
    confident[np.arange(12), np.arange(12) % 4] = 50.0           # 4 classes, each predicted by 3 images
    assert iq.inception_score(confident, splits=1) == pytest.approx((4.0, 0.0), abs=1e-9)
    uniform = np.zeros((10, 6))
    mean, std = iq.inception_score(uniform, splits=5)
    assert mean == pytest.approx(1.0) and std == pytest.approx(0.0, abs=1e-12)
    # the same seed draws the same splits, whatever the caller's torch RNG state
    rng = np.random.default_rng(1).normal(size=(40, 5))
    torch.manual_seed(123)
    first = iq.inception_score(rng, splits=4, seed=7)
    torch.manual_seed(456)
    assert iq.inception_score(rng, splits=4, seed=7) == first


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("inception") / "inception"
    inception.build_tiny(out)
    return out


def test_features_do_not_depend_on_batch_size_or_order(tiny):
    model = inception.load(tiny)
    paths = sorted(str(p) for p in (REPO / "resources/demo/coco2017/val2017").glob("*.jpg"))[:4]
    feats, logits = iq.extract(model, paths, batch_size=4)
    one, _ = iq.extract(model, paths[::-1], batch_size=1)
    assert feats.shape == (4, 2048) and logits.shape == (4, 10)
    np.testing.assert_allclose(one[::-1], feats, rtol=1e-4, atol=1e-4)
    # the stand-in tells images apart (random weights alone would not: see build_tiny)
    assert np.abs(feats[0] - feats[1]).max() > 1e-3 * np.abs(feats).max()


def test_the_role_loads_torchvision_weights_files_and_refuses_other_folders(tmp_path, tiny):
    from torchvision.models import inception_v3

    net = inception_v3(weights=None, aux_logits=True, init_weights=False)   # torchvision's file has AuxLogits
    torch.save(net.state_dict(), tmp_path / "inception_v3_google-0cc3c7bd.pth")
    loaded = inception.load(tmp_path / "inception_v3_google-0cc3c7bd.pth")
    assert loaded.num_classes == 1000
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(ModelLoadError, match="model_type 'vit'"):
        inception.load(bad)
    assert inception.load(tiny).num_classes == 10


def test_the_table_command_writes_section_10_3_with_the_papers_numbers(tmp_path, capsys):
    rng = np.random.default_rng(2)
    features = {}
    for name, shift in (("social_counterfactuals", 0.0), ("visogender", 1.0), ("pata", 2.0), ("ref_0", 0.0)):
        path = tmp_path / f"{name}.npz"
        iq.save_features(path, rng.normal(shift, 1.0, (20, 4)), rng.normal(size=(20, 3)),
                         [f"{name}_{i}.png" for i in range(20)])
        features[name] = path
    cfg = tmp_path / "cfg.yaml"
    images = REPO / "resources/demo"
    cfg.write_text(f"""social_counterfactuals:
  image_quality: {{references: {{ImageNet: {images}/classification/imagenet/val, LAION-2B: null}}, splits: 2}}
  probing:
    pata: {{files_list: {images}/pata/pata_fairness.files.lst, captions_json: {images}/pata/pata_fairness.captions.json,
           image_dir: {images}/pata/images}}
    visogender: {{oo_tsv: {images}/visogender/OO_Visogender_10052025.tsv, image_dir: {images}/visogender/images}}
""")
    assert main(["social", "image-quality-table", "--config", str(REPO / "config/config.yaml"), "--config", str(cfg),
                 "--features", *[f"{n}={p}" for n, p in features.items()], "--out-md", str(tmp_path / "t.md"),
                 "--out-csv", str(tmp_path / "t.csv"), "--out-html", str(tmp_path / "t.html")]) == 0
    import pandas as pd

    table = pd.read_csv(tmp_path / "t.csv")
    assert table["dataset"].tolist() == ["SocialCounterfactuals", "VisoGender", "PATA"]
    # the further a set's features are shifted from the reference, the larger its FID (decisive shifts)
    assert table["FID (ImageNet)"].is_monotonic_increasing and "FID (LAION-2B)" not in table
    md = (tmp_path / "t.md").read_text()
    assert "106.83" in md and "Not computed: FID against LAION-2B" in md
    assert main(["social", "image-quality-table", "--config", str(REPO / "config/config.yaml"), "--config", str(cfg),
                 "--features", f"pata={features['pata']}",
                 "--out-md", str(tmp_path / "u.md"), "--out-csv", str(tmp_path / "u.csv")]) == 2
    assert "lacks social_counterfactuals" in capsys.readouterr().err
