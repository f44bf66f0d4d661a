"""CVLD faithful to the paper (round 3, issue 43): nocaps in the paper config (Table 4), the two-stage ITC + ITM
ranking of the FairFace bias metrics (§4.3, Table 3), DEO as the median over bootstrap resamples."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _paper_view():
    from counterfactory.config import load_config

    return load_config([str(REPO / "config" / "config.yaml")], study="cvld")


def test_paper_config_runs_table4_nocaps_columns():
    from counterfactory.studies.cvld import settings as cs

    s = cs.settings(_paper_view())
    assert s["data"]["nocaps"]["annotations"].endswith("nocaps_val_4500_captions.json")
    assert s["data"]["nocaps"]["image_root"].rstrip("/").endswith("images")
