"""CVLD study: settings (appendix A-C, §5.1), the runs of Tables 1-4, nested COCO subsets, editing requests from the
vote, the counterfactual an example trains on, the COCO training table, the mixed-direction t-tests, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from counterfactory import cli
from counterfactory.config import load_config
from counterfactory.errors import ConfigError, InputError
from counterfactory.studies.cvld import data as dt
from counterfactory.studies.cvld import runs as rn
from counterfactory.studies.cvld import settings as st
from counterfactory.studies.cvld import tables as tb


def test_defaults_follow_the_paper():
    s = st.settings(None)
    assert (s["editing"]["m"], s["editing"]["k"]) == (10, 3)                        # §5.1
    cl = s["classification"]
    assert cl["shots"] == [16, 256] and cl["episodes"] == 10 and len(cl["attributes"]) == 14   # Table 1, app. A
    assert (cl["train"]["batch_size"], cl["train"]["lr"], cl["train"]["lam"]) == (32, 1e-2, 1.0)   # app. C
    rt = s["retrieval"]["train"]
    assert (rt["epochs"], rt["lr"], rt["batch_size"], rt["lam"]) == (6, 1e-5, 128, 0.3)
    ct = s["captioning"]["train"]
    assert (ct["epochs"], ct["lr"], ct["lam"]) == (5, 1e-5, 0.3)
    assert s["data"]["subsets"] == [0.1, 0.01] and s["retrieval"]["fairface_ks"] == [1000, 128]
    from counterfactory.data.celeba import GENDER_INDEPENDENT

    assert list(cl["attributes"]) == list(GENDER_INDEPENDENT)      # one list of the 14 attributes, two modules agree


def test_retrieval_reranks_blips_depth_per_test_set_and_records_it(monkeypatch):
    # appendix A "the standard procedure of BLIP": ITM re-ranks the ITC top 256 on COCO, the top 128 on Flickr30K
    from counterfactory.evaluation import cvld as ev

    s = st.settings({"data": {"flickr30k": {"karpathy_json": "f.json"}}})
    assert (st.rerank_depth(s, "coco"), st.rerank_depth(s, "flickr30k")) == (256, 128)
    assert st.rerank_depth(st.settings({"retrieval": {"rerank_k": 4}}), "flickr30k") == 4
    frame = pd.DataFrame({"split": "test", "image_id": [1, 1, 2], "image_path": ["a", "a", "b"],
                          "caption": ["x", "y", "z"]})
    used = {}

    def fake_recall(model, processor, images, caps, *, rerank_k, batch_size):
        used[len(images) + len(caps)] = rerank_k
        return {"rec@1": 50.0, "mrec": 60.0, "rerank_k": min(rerank_k, len(images))}

    monkeypatch.setattr(rn, "_train_coco", lambda *a, **k: (None, None))
    monkeypatch.setattr(ev, "retrieval_recall", fake_recall)
    monkeypatch.setattr(dt, "captions", lambda s, name: frame.iloc[:1])
    out = rn._retrieval({}, s, "coco1", "base", 0, {}, None, frame, False)
    assert used == {4: 256, 2: 128}                               # COCO test (2 images), Flickr30K test (1 image)
    assert out["COCO:rerank_k"] == 2 and out["Flickr30K:rerank_k"] == 1
    with pytest.raises(ConfigError, match="rerank_k"):
        st.settings({"retrieval": {"rerank_k": {"coco": 256}}})


@pytest.mark.parametrize("section, words", [
    ({"editing": {"mm": 3}}, r"cvld.editing: unknown key\(s\) mm"),
    ({"editing": {"k": 11}}, "k = 11 is above m = 10"),
    ({"editing": {"methods": ["dalle"]}}, "editing.methods"),
    ({"editing": {"train_method": "null_text", "methods": ["ip2p"]}}, "not in editing.methods"),
    ({"intervention": {"text_method": "gpt"}}, "text_method"),
    ({"classification": {"attributes": ["Male"]}}, "classification.attributes"),
    ({"retrieval": {"variants": ["cvld", "debias"]}}, r"cvld.retrieval.variants.1: 'debias' is not one of"),
    ({"editing": {"shardz": 4}}, r"cvld.editing: unknown key\(s\) shardz \(cvld.editing.shardz\)"),
    ({"data": {"subsets": [0.1, 2]}}, "data.subsets"),
    ({"data": {"celeba": {"rooot": "x"}}}, r"cvld.data.celeba: unknown key\(s\) rooot"),
])
def test_bad_settings_name_the_key(section, words):
    with pytest.raises(ConfigError, match=words):
        st.settings({"cvld": section})


def test_sections_merge_with_the_schema_defaults_and_a_partial_view_refuses_missing_sections(repo):
    s = st.settings({"cvld": {"editing": {"settings": {"steps": 5}}, "retrieval": {"train": {"max_steps": 2}}}})
    assert s["editing"]["settings"]["steps"] == 5 and s["retrieval"]["train"]["max_steps"] == 2
    assert s["editing"]["settings"]["size"] == 512                     # the schema fills the other keys
    assert s["retrieval"]["train"]["lr"] == 1e-5                       # merged, not replaced

    class Partial(dict):
        partial = True

    view = st.settings(Partial(retrieval={}))
    assert "retrieval" in view
    with pytest.raises(ConfigError, match="not given the config section cvld.editing"):
        view["editing"]


def test_no_internal_marker_reaches_the_settings(repo):
    """The marker of free-form sections never leaks into merged settings, at any depth, with or without a user
    section (a leak made every run of the paper config fail to build its trainer settings)."""
    FREE = "__free__"                                   # the marker free-form sections once carried

    def keys(value):
        if isinstance(value, dict):
            for k, v in value.items():
                yield k
                yield from keys(v)

    for cfg in (None, {"cvld": {"retrieval": {"train": {"max_steps": 2}}}},
                load_config([repo / "config" / "config.yaml"], study="cvld")):
        assert FREE not in set(keys(dict(st.settings(cfg))))
    s = st.settings(None)
    for task in ("classification", "retrieval", "captioning"):
        settings = rn._train_settings(s, task, "cvld", 0, False)
        assert settings.lr == s[task]["train"]["lr"] and settings.lam == s[task]["train"]["lam"]
    with pytest.raises(ConfigError, match=r"cvld.retrieval.train: unknown key\(s\) bogus"):
        st.settings({"cvld": {"retrieval": {"train": {"bogus": 1}}}})


def test_runs_of_the_paper_config(repo):
    s = st.settings(load_config([repo / "config" / "config.yaml"], study="cvld"))
    runs = pd.DataFrame(st.runs(s))
    count = runs.groupby(["task", "setting", "variant"]).size()
    assert count[("classification", "k16", "cvld")] == count[("classification", "k256", "base")] == 10
    assert count[("retrieval", "coco1", "neg_only")] == 3 and ("retrieval", "coco10", "neg_only") not in count
    assert count[("captioning", "coco10", "balanced")] == 3 and count[("captioning", "pt", "pretrained")] == 1
    assert count[("classification", "k256", "cvld_lam0.5")] == 10 and ("classification", "k16", "cvld_lam0.5") \
        not in count                                                 # Figure 4's λ sweep at K = 256
    assert count[("classification", "full", "base")] == 1          # Table 1's full-data BLIP row
    assert count[("retrieval", "coco10-384", "balanced")] == 3 and count[("retrieval", "full-384", "base")] == 1
    assert len(runs) == 91 + 3 * 10 + 1 + 2 * 3 * 3 + 1   # + Table 2's 384 px rows: 2 subsets x 3 x 3 seeds, full data
    assert st.lambda_of(s, "retrieval", "cvld") == 0.3 and st.lambda_of(s, "retrieval", "neg_only") == 0.0
    assert st.lambda_of(s, "classification", "cvld_lam0.25") == 0.25 and st.lambda_of(s, "captioning", "base") == 0


def test_subsets_are_nested_and_stable():
    ids = list(range(5000))
    ten, one = dt.subset_of(ids, 0.1), dt.subset_of(ids, 0.01)
    assert not (one & ~ten).any()                                      # COCO 1% inside COCO 10%
    assert abs(ten.mean() - 0.1) < 0.02 and abs(one.mean() - 0.01) < 0.006
    shuffled = list(reversed(ids))
    np.testing.assert_array_equal(dt.subset_of(shuffled, 0.1)[::-1], ten)   # order does not matter
    assert not (dt.subset_of(ids, 0.1, seed=1) == ten).all()
    assert st.subset_name(0.1) == "coco10" and st.subset_name(0.01) == "coco1"


def swapped_captions():
    rows = [(1, "A man rides a horse.", "A woman rides a horse.", "turn the man into a woman"),
            (1, "A horse in a field.", "A horse in a field.", "no change"),
            (1, "The man holds his hat.", "The woman holds her hat.", "turn the man into a woman"),
            (2, "A girl and a dog.", "A boy and a dog.", "turn the girl into a boy"),
            (2, "A dog runs.", "A dog runs.", "no change"),
            (2, "A dog barks.", "A dog barks.", "no change")]
    frame = pd.DataFrame(rows, columns=["image_id", "caption", "intervened", "edit_prompt"])
    frame["caption_id"] = [f"{i}_{k}" for k, i in enumerate(frame["image_id"])]
    frame["image_path"] = frame["image_id"].map(lambda i: f"img/{i}.jpg")
    frame["split"] = "train"
    return frame


def test_coco_requests_come_from_the_winning_edit():
    from counterfactory.text.gender import majority_vote

    caps = swapped_captions()
    votes = majority_vote(caps)
    assert votes.set_index("image_id")["accepted"].to_dict() == {1: True, 2: False}   # 2 of 3 vs 1 of 3
    s = st.settings({"cvld": {"editing": {"shards": 4}}})
    req = dt.coco_requests(s, caps, votes)
    assert list(req.columns) == dt.REQUEST_COLUMNS and len(req) == 1
    r = req.iloc[0]
    assert (r.item_id, r.edit_prompt, r.source_prompt, r.target_prompt) == \
        ("coco_1", "turn the man into a woman", "A man rides a horse.", "A woman rides a horse.")
    assert 0 <= r.shard < 4 and r.shard == dt.shard_of("coco_1", 4)


def test_celeba_requests_use_the_manual_prompts():
    s = st.settings(None)
    images = pd.DataFrame({"image_id": ["000001.jpg", "000002.jpg"], "image_path": ["a", "b"], "Male": [1, 0]})
    req = dt.celeba_requests(s, images)
    assert list(req["item_id"]) == ["celeba_000001", "celeba_000002"]
    assert list(req["edit_prompt"]) == ["turn the man into a woman", "turn the woman into a man"]
    assert list(req["target_prompt"]) == ["a photo of a woman", "a photo of a man"]


def test_counterfactual_choice_is_deterministic_and_spread(tmp_path):
    manifest = pd.DataFrame({"item_id": ["coco_1"] * 3 + ["coco_2"] * 3, "candidate": [0, 1, 2] * 2,
                             "kept": [True, False, True, True, True, False], "rank": [1, -1, 0, 0, 1, -1],
                             "path": ["coco_1_1.png", "", "coco_1_0.png", "coco_2_0.png", "coco_2_1.png", ""]})
    manifest.to_parquet(tmp_path / "shard.parquet")
    files = rn.counterfactual_files([tmp_path / "shard.parquet"])
    assert files["coco_1"] == [str(tmp_path / "coco_1_0.png"), str(tmp_path / "coco_1_1.png")]   # best first
    picks = {rn.pick(files, "coco_1", seed) for seed in range(20)}
    assert picks == set(files["coco_1"])                               # seeds spread over the k kept edits
    assert rn.pick(files, "coco_1", 3) == rn.pick(files, "coco_1", 3) and rn.pick(files, "coco_9", 0) == ""


def test_merged_edit_manifest_gives_the_runs_the_same_files_as_its_shards(tmp_path, capsys):
    from counterfactory.cli import main
    from counterfactory.errors import ConfigError

    method = tmp_path / "celeba" / "edits" / "ip2p"
    shards = []
    for shard, items in (("00000", ["a", "b"]), ("00001", ["c"])):
        (method / shard).mkdir(parents=True)
        rows = [{"item_id": f"celeba_{i}", "candidate": c, "seed": c, "params": "{}", "similarity": 0.5 - c / 10,
                 "kept": c < 2, "rank": c if c < 2 else -1, "path": f"celeba_{i}_{c}.png"}
                for i in items for c in range(3)]
        pd.DataFrame(rows).to_parquet(method / shard / "shard.parquet")
        shards.append(str(method / shard / "shard.parquet"))
    out = method / "edits.parquet"
    assert main(["cvld", "edit-merge", "--shards", *shards, "--out", str(out)]) == 0
    merged = pd.read_parquet(out)
    assert len(merged) == 9 and merged["path"].iloc[0] == "00000/celeba_a_0.png"
    assert rn.counterfactual_files([out]) == rn.counterfactual_files(shards)   # the same paths, best first
    assert rn.counterfactual_files([out])["celeba_c"] == [str(method / "00001" / f"celeba_c_{r}.png") for r in (0, 1)]
    merged.loc[0, "path"] = "../../elsewhere.png"
    merged.to_parquet(out)
    with pytest.raises(ConfigError, match="leaves the manifest's folder"):
        rn.counterfactual_files([out])
    # a shard of another method's folder: one line naming the file, nothing written
    assert main(["cvld", "edit-merge", "--shards", shards[0], "--out", str(tmp_path / "edits.parquet")]) != 0
    assert "not a shard of" in capsys.readouterr().err and not (tmp_path / "edits.parquet").exists()


def test_coco_training_table_pairs_captions_with_their_intervention():
    s = st.settings({"cvld": {"data": {"subsets": [1.0]}}})
    caps = swapped_captions()
    files = {"coco_1": ["cf1.png"]}
    table = rn.coco_training_table(s, caps, "coco100", "cvld", 0, files)
    assert list(table["cf_image_path"]) == ["cf1.png"] * 3 + [""] * 3
    assert list(table["cf_caption"][:3]) == ["A woman rides a horse.", "A horse in a field.",
                                             "The woman holds her hat."]   # a neutral caption stays itself
    assert list(table["gender"][:3]) == ["male"] * 3 and list(table["gender"][3:]) == ["female"] * 3
    with pytest.raises(ConfigError, match="unknown COCO subset"):
        rn.coco_training_table(s, caps, "coco10", "cvld", 0, files)


def test_captioner_trains_and_generates_after_blips_prompt(monkeypatch, tmp_path):
    # BLIP trains its captioner on "a picture of " + caption and generates after the same prompt
    from counterfactory.models import registry
    from counterfactory.training import cvld as tr

    s = st.settings({"cvld": {"data": {"subsets": [1.0]}, "retrieval": {"image_size": None},
                              "captioning": {"image_size": None}}})
    assert s["captioning"]["prompt"] == "a picture of "
    seen = {}
    monkeypatch.setattr(registry, "load", lambda cfg, role: ("model", "processor"))
    monkeypatch.setattr(tr, "train_captioning", lambda m, p, table, *a, **k: seen.setdefault("captioning", table)
                        is seen.setdefault("prompt", k.get("prompt")))
    monkeypatch.setattr(tr, "train_retrieval", lambda m, p, table, *a, **k: seen.setdefault("retrieval", table))
    files = {"coco_1": ["cf1.png"]}
    for task in ("captioning", "retrieval"):
        rn._train_coco({"models": {"captioner_pretrained": {}, "itm_blip": {}}}, s, task, "coco100", "cvld", 0, files, tmp_path,
                       swapped_captions(), False)
    cap = seen["captioning"]
    assert seen["prompt"] == "a picture of "    # the trainer leaves the prompt's tokens out of the loss
    assert cap["caption"].iloc[0] == "a picture of A man rides a horse."
    assert list(cap["cf_caption"]) == ["a picture of A woman rides a horse.", "a picture of A horse in a field.",
                                       "a picture of The woman holds her hat."] + [""] * 3
    assert seen["retrieval"]["caption"].iloc[0] == "A man rides a horse."     # retrieval has no prompt
    plain = seen["retrieval"].iloc[:1]
    assert rn.with_caption_prompt(plain, "").equals(plain)                  # "" = no prompt


def test_every_kept_edit_enters_the_training_set():
    # §5.1 keeps the top k = 3 edits per example and adds the edited pairs to the training set: an image's caption
    # rows take its kept edits in turn (ours, one_per_seed: one edit per image and seed)
    s = st.settings({"cvld": {"data": {"subsets": [1.0]}}})
    assert s["editing"]["per_example"] == "all_kept"
    files = {"coco_1": ["a.png", "b.png", "c.png"], "coco_2": ["d.png", "e.png"]}
    for seed in range(4):
        table = rn.coco_training_table(s, swapped_captions(), "coco100", "cvld", seed, files)
        assert set(table["cf_image_path"][:3]) == {"a.png", "b.png", "c.png"}
        assert set(table["cf_image_path"][3:]) == {"d.png", "e.png"} and len(table) == 6
    one = st.settings({"cvld": {"data": {"subsets": [1.0]}, "editing": {"per_example": "one_per_seed"}}})
    table = rn.coco_training_table(one, swapped_captions(), "coco100", "cvld", 0, files)
    assert table["cf_image_path"][:3].nunique() == 1 and table["cf_image_path"][0] == rn.pick(files, "coco_1", 0)


def test_nocaps_validation_is_scored_with_the_captioner(monkeypatch, tmp_path):
    # Table 4's zero-shot nocaps columns: the public validation annotations (COCO caption format) and pycocoevalcap
    from types import SimpleNamespace

    from counterfactory.evaluation import cvld as ev
    from counterfactory.metrics import captioning as mc

    ann = tmp_path / "nocaps_val.json"
    ann.write_text(json.dumps({"images": [{"id": 7, "file_name": "a.jpg"}, {"id": 8, "file_name": "b.jpg"},
                                          {"id": 9, "file_name": "c.jpg"}],
                               "annotations": [{"image_id": 7, "caption": "a dog"}, {"image_id": 7, "caption": "a pup"},
                                               {"image_id": 8, "caption": "a cat"}]}))
    s = st.settings({"data": {"nocaps": {"annotations": str(ann), "image_root": str(tmp_path)}},
                     "captioning": {"image_size": None}})
    images, refs, ids = dt.nocaps(s)
    assert (images, refs, ids) == ([str(tmp_path / "a.jpg"), str(tmp_path / "b.jpg")], [["a dog", "a pup"], ["a cat"]],
                                   [7, 8])
    scored = []
    model = SimpleNamespace(vision_model=SimpleNamespace(embeddings=SimpleNamespace(image_size=384)))
    monkeypatch.setattr(rn, "_train_coco", lambda *a, **k: (model, None))
    monkeypatch.setattr(ev, "generate_captions", lambda m, p, imgs, **k: [f"caption {i}" for i in range(len(imgs))])
    monkeypatch.setattr(mc, "coco_caption_scores", lambda r, c, **k: scored.append(sorted(r)) or
                        {"BLEU-4": 1.0, "CIDEr": 2.0 * len(r), "SPICE": 3.0})
    out = rn._captioning({}, s, "coco1", "base", 0, {}, tmp_path, swapped_captions().assign(split="test"), False)
    assert scored[1] == [7, 8] and out["nocaps:CIDEr"] == 4.0 and out["nocaps:SPICE"] == 3.0
    assert (tmp_path / "nocaps_captions.csv").is_file() and out["image_size"] == 384
    ann.write_text(json.dumps({"images": [], "annotations": [{"image_id": 1}]}))
    with pytest.raises(InputError, match="annotations"):
        dt.nocaps(s)


def test_balanced_training_table_equalises_genders():
    s = st.settings({"cvld": {"data": {"subsets": [1.0]}}})
    caps = swapped_captions()
    extra = caps[caps["image_id"] == 1].assign(image_id=3, caption_id=lambda f: f["caption_id"] + "b")
    caps = pd.concat([caps, extra], ignore_index=True)            # two "male" images, one "female"
    table = rn.coco_training_table(s, caps, "coco100", "balanced", 0, {})
    genders = table.drop_duplicates("gender")["gender"]
    per_image = table.groupby("gender")["image_path"].nunique()
    assert set(genders) == {"male", "female"} and per_image["male"] == per_image["female"] == 1


def test_summary_tests_fairness_metrics_for_lower_values():
    rows = []
    for seed in range(4):
        for mix, deo, ap in (("base", 20 + seed, 80 + seed), ("cvld", 10 + seed, 90 + seed)):
            rows += [{"experiment": "classification_k16", "mixture": mix, "seed": seed, "data_seed": seed,
                      "metric": "DEO", "value": float(deo)},
                     {"experiment": "classification_k16", "mixture": mix, "seed": seed, "data_seed": seed,
                      "metric": "AP", "value": float(ap)}]
    rows.append({"experiment": "classification", "mixture": "pretrained", "seed": 0, "data_seed": 0,
                 "metric": "DEO", "value": 5.0})
    summary = tb.summarize(pd.DataFrame(rows)).set_index(["experiment", "metric", "mixture"])
    deo, ap = summary.loc[("classification_k16", "DEO", "cvld")], summary.loc[("classification_k16", "AP", "cvld")]
    assert deo["alternative"] == "less" and bool(deo["significant"]) and deo["delta"] == -10
    assert ap["alternative"] == "greater" and bool(ap["significant"])
    pt = summary.loc[("classification", "DEO", "pretrained")]
    assert pt["n"] == 1 and pt["mean"] == 5.0 and not bool(pt["significant"])
    assert tb.lower_is_better("MaxSkew@128") and tb.lower_is_better("DEO:Bangs") and not tb.lower_is_better("mRec")


def test_figure5_right_panel_is_the_share_of_men_for_doctor_and_nurse(tmp_path):
    # Figure 5 (right): the share of men among the top K images for "a photo of a doctor" / "... nurse"
    assert st.settings(None)["retrieval"]["occupations"] == ["doctor", "nurse"]
    sim = np.array([[0.9, 0.8, 0.1, 0.7], [0.1, 0.2, 0.9, 0.8]])          # doctor: 0, 1, 3, 2; nurse: 2, 3, 1, 0
    shares = rn.occupation_shares(sim, ["Male", "Male", "Female", "Female"], ["doctor", "nurse"], [1, 2, 3, 8])
    assert shares == {"MaleShare@1:doctor": 100.0, "MaleShare@2:doctor": 100.0,
                      "MaleShare@3:doctor": pytest.approx(200 / 3), "MaleShare@1:nurse": 0.0,
                      "MaleShare@2:nurse": 0.0, "MaleShare@3:nurse": pytest.approx(100 / 3)}
    rows = [{"experiment": "retrieval_coco1", "mixture": mix, "seed": seed, "data_seed": seed, "metric": m,
             "value": v + seed} for seed in range(2) for mix in ("base", "cvld") for m, v in
            {**shares, "MaxSkewCurve@2": 0.3}.items()]
    summary = tb.summarize(pd.DataFrame(rows))
    fig, axes = [], []
    from counterfactory import render

    real = render.pyplot

    class Spy:
        def __getattr__(self, name):
            return getattr(real(), name)

        def subplots(self, *a, **k):
            f, ax = real().subplots(*a, **k)
            fig.append(f)
            axes.append(ax)
            return f, ax

    import unittest.mock as um

    with um.patch.object(render, "pyplot", lambda: Spy()):
        out = tb.figure5(summary, st.settings(None), tmp_path / "figure5.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    right = axes[0][1]
    assert "doctor" in right.get_title() and len(right.get_legend().get_texts()) == 4    # 2 jobs x {base, CVLD}


def test_table1_has_the_full_data_blip_row():
    # Table 1: BLIP^PT, BLIP fine-tuned on the whole CelebA training split, then the K-shot blocks
    s = st.settings(None)
    assert s["classification"]["full_data"] and {"task": "classification", "setting": "full", "variant": "base",
                                                 "seed": 0} in st.runs(s)
    rows = [{"experiment": e, "mixture": m, "seed": seed, "data_seed": seed, "metric": "DEO", "value": 10.0 + seed}
            for e, m, seeds in (("classification", "pretrained", [0]), ("classification_full", "base", [0]),
                                ("classification_k256", "base", [0, 1]), ("classification_k256", "cvld", [0, 1]))
            for seed in seeds]
    table = dict(tb.paper_tables(tb.summarize(pd.DataFrame(rows)), s))
    t1 = table[next(t for t in table if t.startswith("Table 1"))]
    assert t1.row_labels[:3] == ["BLIP^PT", "BLIP (full data)", "256-shot BLIP"]
    off = st.settings({"classification": {"full_data": False}})
    assert not any(r["setting"] == "full" for r in st.runs(off))


def test_cli_swap_gender_on_a_csv(tmp_path, capsys, nltk_dir):
    src = tmp_path / "caps.csv"
    src.write_text("caption_id,caption\na,A man and his dog.\nb,A red bus.\n", encoding="utf-8")
    out = tmp_path / "out.parquet"
    assert cli.main(["cvld", "swap-gender", "--captions", str(src), "--out", str(out)]) == 0
    table = pd.read_parquet(out)
    assert list(table["intervened"]) == ["A woman and her dog.", "A red bus."]
    assert list(table["changed"]) == [True, False] and json.loads(table["edits"][0]) == [["man", "woman"],
                                                                                         ["his", "her"]]
    assert "1 of 2 captions changed" in capsys.readouterr().out
    bad = tmp_path / "bad.csv"
    bad.write_text("id,text\na,A man.\n", encoding="utf-8")
    assert cli.main(["cvld", "swap-gender", "--captions", str(bad), "--out", str(tmp_path / "x.parquet")]) != 0
    assert not (tmp_path / "x.parquet").exists()
    err = capsys.readouterr().err
    assert str(bad) in err and "caption" in err
    with pytest.raises(InputError):
        from counterfactory.commands.cvld import _read_table

        _read_table(tmp_path / "missing.csv")


def test_table2_and_table4_head_columns_by_dataset_as_the_paper_does():
    """Table 2 groups its columns FairFace / COCO / Flickr30K with the bare metric below (not ``COCO:Rec@1``);
    Table 4 puts the COCO metrics under COCO and the zero-shot ones under nocaps."""
    s = st.settings(None)
    metrics = ["Bias@1000", "MaxSkew@1000", "COCO:Rec@1", "COCO:mRec", "Flickr30K:Rec@1", "Flickr30K:mRec",
               "CIDEr", "nocaps:CIDEr"]
    rows = [{"experiment": e, "mixture": m, "seed": 0, "data_seed": 0, "metric": metric, "value": 1.0}
            for e, m in (("retrieval", "pretrained"), ("captioning", "pretrained")) for metric in metrics]
    table = dict(tb.paper_tables(tb.summarize(pd.DataFrame(rows)), s))
    t2 = table[next(t for t in table if t.startswith("Table 2"))]
    assert t2.col_headers == [("FairFace", "Bias@1000"), ("FairFace", "MaxSkew@1000"), ("COCO", "Rec@1"),
                              ("COCO", "mRec"), ("Flickr30K", "Rec@1"), ("Flickr30K", "mRec")]
    t4 = table[next(t for t in table if t.startswith("Table 4"))]
    assert t4.col_headers == [("COCO", "CIDEr"), ("nocaps", "CIDEr")]
    from counterfactory.tables import render_markdown

    markdown = render_markdown(t2)
    assert "COCO:Rec@1" not in markdown and "Flickr30K" in markdown and "FairFace" in markdown
