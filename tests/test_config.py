"""Config: both shipped configs validate; mistakes fail at start-up naming the key; study views; job
configurations are content-addressed and hold only the sections a job declared."""

from __future__ import annotations

import pytest
import yaml

from counterfactory.config import (ConfigError, load_config, load_full_config, study_view, write_job_config)
from counterfactory.errors import ConfigError as _ConfigError

STUDY = "coco_counterfactuals"


@pytest.mark.parametrize("name", ["config.yaml", "demo.yaml"])
def test_shipped_configs_validate(repo, name):
    cfg = load_config([repo / "config" / name])
    assert cfg["study"] == STUDY
    assert cfg["captions"]["mlm_top_k"] == 10  # §3.1
    assert cfg["captions"]["similarity_low"] == 0.8 and cfg["captions"]["similarity_high"] == 0.91


def test_paper_config_cites_paper_models(repo):
    cfg = load_config([repo / "config" / "config.yaml"])
    assert cfg["models"]["mlm"]["source"] == "roberta-base"
    assert cfg["models"]["lm"]["source"] == "gpt2-large"
    assert cfg["models"]["sentence"]["source"].endswith("all-MiniLM-L6-v2")


def _write(tmp_path, data, name="c.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda c: c[STUDY]["captions"].update(mlm_top_k="ten"), f"{STUDY}.captions.mlm_top_k"),
        (lambda c: c[STUDY]["captions"].update(shard_size=0), f"{STUDY}.captions.shard_size"),
        (lambda c: c.update(devcie="cpu"), "devcie"),  # typo of a top-level key
        (lambda c: c["models"].pop("mlm"), "mlm"),
        (lambda c: c["models"]["lm"].update(sorce="x"), "sorce"),
        (lambda c: c.update(device="gpu"), "device"),
        (lambda c: c[STUDY]["captions"].update(similarity_high=1.5), "similarity_high"),
        (lambda c: c[STUDY]["captions"].update(similarity_low=0.95), "similarity_low (0.95) must be below"),
        (lambda c: c[STUDY]["images"].update(p_range=[0.9, 0.1]), "p_range"),
        (lambda c: c.update(studies=["no_such_study"]), "studies"),
        (lambda c: c[STUDY].update(captoins={}), "captoins"),
    ],
)
def test_config_failures_name_the_key(repo, tmp_path, mutate, needle):
    cfg = yaml.safe_load((repo / "config" / "demo.yaml").read_text())
    mutate(cfg)
    with pytest.raises(ConfigError) as err:
        load_config([_write(tmp_path, cfg)])
    assert needle in str(err.value)
    assert "Fix:" in str(err.value)
    assert len(str(err.value).splitlines()) < 15  # one short message, not a dump


def test_later_files_override_earlier(repo, tmp_path):
    override = _write(tmp_path, {STUDY: {"captions": {"shard_size": 7}}})
    cfg = load_config([repo / "config" / "demo.yaml", override])
    assert cfg["captions"]["shard_size"] == 7
    assert cfg["captions"]["mlm_top_k"] == 10  # merged, not replaced


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config([tmp_path / "nope.yaml"])
    assert ConfigError is _ConfigError


def test_view_has_shared_and_study_sections(repo):
    full = load_full_config([repo / "config" / "demo.yaml"])
    view = study_view(full, STUDY)
    assert view["models"] == full["models"] and view["images"] == full[STUDY]["images"]
    assert "studies" not in view and STUDY not in view


def test_job_config_is_content_addressed_and_partial(repo, tmp_path):
    full = load_full_config([repo / "config" / "demo.yaml"])
    keys = ["captions", "nltk", "models.mlm"]
    path = write_job_config(full, STUDY, keys, folder=tmp_path)
    assert write_job_config(full, STUDY, keys, folder=tmp_path) == path  # same settings, same file
    # an unrelated edit gives the same file; a relevant edit a new one, leaving the first untouched
    full[STUDY]["images"]["steps"] = 99
    assert write_job_config(full, STUDY, keys, folder=tmp_path) == path
    before = open(path).read()
    full[STUDY]["captions"]["similarity_low"] = 0.81
    other = write_job_config(full, STUDY, keys, folder=tmp_path)
    assert other != path and open(path).read() == before
    job = load_config([other])
    assert job["captions"]["similarity_low"] == 0.81
    assert set(job["models"]) == {"mlm"}
    with pytest.raises(ConfigError, match="not given the config section 'images'"):
        job["images"]
    with pytest.raises(ConfigError, match="not given the config section 'seed'"):
        job.get("seed", 0)


def test_job_config_cannot_be_merged(repo, tmp_path):
    full = load_full_config([repo / "config" / "demo.yaml"])
    path = write_job_config(full, STUDY, ["captions"], folder=tmp_path)
    with pytest.raises(ConfigError, match="cannot be merged"):
        load_config([path, repo / "config" / "demo.yaml"])


# ----------------------------------------------------------------------------- issue 26: one configuration source
def _demo(repo):
    return yaml.safe_load((repo / "config" / "demo.yaml").read_text())


@pytest.mark.parametrize("study", ["coco_counterfactuals", "social_counterfactuals", "countercurate",
                                   "spurious_retrieval", "cvld"])
def test_every_study_declares_its_model_roles_and_a_missing_one_fails_at_start_up(repo, tmp_path, study):
    from counterfactory.config import study_roles

    assert study_roles(study), f"{study} declares no required model role"
    for role in study_roles(study):
        cfg = _demo(repo)
        cfg["studies"] = [study]
        cfg["models"].pop(role)
        with pytest.raises(ConfigError) as err:
            load_full_config([_write(tmp_path, cfg)])
        assert f"models.{role}" in str(err.value) and study in str(err.value) and "Fix:" in str(err.value)


@pytest.mark.parametrize("path", [
    "cvld.editing.shardz", "countercurate.grounded.stepz", "spurious_retrieval.inpaint.methodz",
    "coco_counterfactuals.images.filter.top_kk", "social_counterfactuals.probing.pata.image_dirr",
    "countercurate.training.common.lr_schedulr", "cvld.classification.train.epochz",
    "spurious_retrieval.training.clip.lrr", "countercurate.vlm.lora_rank",
])
def test_a_typo_at_any_depth_fails_at_start_up_naming_the_key(repo, tmp_path, path):
    cfg = _demo(repo)
    *parents, leaf = path.split(".")
    node = cfg
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = 1
    with pytest.raises(ConfigError) as err:
        load_full_config([_write(tmp_path, cfg)])
    message = str(err.value)
    assert path in message and "unknown key" in message and "Fix:" in message


def test_config_reference_page_is_generated_from_the_schema(repo):
    """docs/config-reference.md cannot go stale: regenerate it with `python scripts/config_reference.py`."""
    from counterfactory.config import reference_markdown

    page = (repo / "docs" / "config-reference.md").read_text(encoding="utf-8")
    assert page == reference_markdown(), "docs/config-reference.md is stale: run python scripts/config_reference.py"
    for key in ("cvld.editing.m", "spurious_retrieval.selection.alpha1", "social_counterfactuals.probing.roles"):
        assert f"| `{key}` |" in page


def test_shared_definitions_are_filled_like_sections():
    from counterfactory.config import fill_definition, fill_section

    assert fill_definition("llm_decoding", {"batch_size": 2}) == {"batch_size": 2, "max_new_tokens": 512,
                                                                  "cache": None, "image_max_side": 768}
    assert fill_section("cvld.llm") == fill_section("countercurate.llm") == fill_definition("llm_decoding")
    with pytest.raises(ConfigError, match=r"cvld\.llm: unknown key\(s\) beams"):
        fill_section("cvld.llm", {"beams": 2})


def test_library_defaults_agree_with_the_schema():
    """Library kernels keep keyword defaults for direct use; where the schema describes the same keys the values
    must agree (the schema's are what a run uses)."""
    import dataclasses

    from counterfactory.config import fill_section
    from counterfactory.generation.editing import EditSettings
    from counterfactory.generation.inpaint import InpaintSettings
    from counterfactory.training.cvld import CVLDSettings

    for cls, section, skip in ((InpaintSettings, fill_section("spurious_retrieval.inpaint"), ()),
                               (EditSettings, fill_section("cvld.editing.settings"), ("m", "k"))):
        for f in dataclasses.fields(cls):
            if f.name in skip:
                continue
            value = section[f.name]
            assert (tuple(value) if isinstance(value, list) else value) == f.default, (cls.__name__, f.name)
    from counterfactory.generation.grounded import GroundedSettings

    grounded = fill_section("countercurate.grounded")
    assert set(grounded) == {f.name for f in dataclasses.fields(GroundedSettings)} | {"keep_work", "precision"}
    assert GroundedSettings.from_config(grounded) == GroundedSettings()
    for f in dataclasses.fields(GroundedSettings):
        assert grounded[f.name] == f.default, ("GroundedSettings", f.name)
    train = fill_section("cvld.retrieval.train")
    for name in ("weight_decay", "max_steps", "n_prompts", "n_prompt_layers"):
        assert train[name] == CVLDSettings.__dataclass_fields__[name].default, name


#: module-level default tables that remain, and why they are not configuration defaults the schema holds
_ALLOWED_DEFAULT_TABLES = {
    "generation/adaptive.py:DEFAULT_SCORE": "which score column a replayed curve ranks by (not a config key)",
    "evaluation/cvld.py:DEFAULT_PROMPTS": "library default of classify_attributes (class prompts, not a config key)",
    "scorers.py:DEFAULT_OPTIONS": "scorer-library defaults shared by every study; evaluation.scorers overrides them",
    "models/registry.py:DEFAULT_LIBRARY": "loader library of each model role (models.<role>.library overrides it)",
}


def test_no_module_restates_schema_defaults_in_a_defaults_table(repo):
    """Defaults are written once, in the schema (issue 26): no DEFAULTS / *_DEFAULTS / DEFAULT_* mapping in the package
    beyond the few library tables above, and none at all under studies/ (single keyword defaults of library kernels,
    e.g. DEFAULT_IMAGE_NAME, are not tables)."""
    import re

    pattern = re.compile(r"^((?:[A-Z_]*_)?DEFAULTS?(?:_[A-Z_]+)?)\s*(?::[^=\n]*)?=\s*(?:\{|dict\(|copy\.)", re.M)
    root = repo / "src" / "counterfactory"
    found = {}
    for path in sorted(root.rglob("*.py")):
        for name in pattern.findall(path.read_text(encoding="utf-8")):
            found[f"{path.relative_to(root).as_posix()}:{name}"] = path
    studies = [key for key in found if key.startswith("studies/")]
    assert not studies, f"defaults tables in study modules (move them to the schema): {studies}"
    extra = sorted(set(found) - set(_ALLOWED_DEFAULT_TABLES))
    assert not extra, f"defaults tables outside the schema: {extra} (move them to config_schema.yaml)"


def test_an_overlay_of_run_name_means_the_same_in_every_command(repo, tmp_path):
    """issue 31, #16: `social captions` took an overlay holding only run_name for a caption-list file."""
    from counterfactory.config import is_config_layer
    from counterfactory.studies.social_counterfactuals import captions

    overlay = tmp_path / "run.yaml"
    overlay.write_text("run_name: probe\n")
    demo = repo / "config" / "demo.yaml"
    assert load_config([demo, overlay])["run_name"] == "probe"
    section, _ = captions.load_section([demo, overlay])
    assert section == captions.load_section([demo])[0]
    assert is_config_layer({"run_name": "x", "seed": 1}) and not is_config_layer({"prefixes": ["A photo of"]})
    # a caption-list file stays one, and an unknown key is still named
    (tmp_path / "bad.yaml").write_text("prefixes: [A photo of]\nnot_a_key: 1\n")
    with pytest.raises(ConfigError, match="not_a_key"):
        captions.load_section([demo, tmp_path / "bad.yaml"])


def test_each_role_names_the_file_that_set_it(repo, tmp_path, monkeypatch):
    """issue 31, #4: a role an overlay leaves out is silently config/config.yaml's hub model; the workflow now
    lists every role with its source and file (the Snakefile logs it on every run, a dry run included)."""
    from counterfactory.config import study_roles, workflow_role_origins

    demo = yaml.safe_load((repo / "config" / "demo.yaml").read_text())
    del demo["models"]["sd"]
    derived = tmp_path / "mine.yaml"
    derived.write_text(yaml.safe_dump(demo, sort_keys=False))
    monkeypatch.chdir(repo)
    cfg = load_full_config([repo / "config" / "config.yaml", derived])
    text = workflow_role_origins(cfg, [derived], {"models": {"lm": {"source": "./elsewhere/lm"}}})
    lines = {line.split(":")[0].strip(): line for line in text.splitlines()[1:]}
    assert "stable-diffusion-v1-5/stable-diffusion-v1-5 <- config/config.yaml" in lines["sd"]
    assert "[inherited from config/config.yaml" in lines["sd"] and "models.sd.source" in lines["sd"]
    assert lines["mlm"].endswith(f"resources/models/tiny/mlm <- {derived}") and "inherited" not in lines["mlm"]
    assert lines["lm"].endswith("./elsewhere/lm <- --config")
    assert set(lines) <= {r for study in cfg["studies"] for r in study_roles(study)}
