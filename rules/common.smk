# Helpers shared by the rule files.
from pathlib import Path

# every rule runs in the project's one environment (`--software-deployment-method conda`)
CONDA_ENV = "../envs/counterfactory.yaml"
# a study's results folder; {study} is a wildcard, so a stage's rules serve every study
S = f"{RESULTS}/{{study}}"


wildcard_constraints:
    study="|".join(STUDIES),
    shard=r"\d+",
    seed=r"\d+",
    role=r"[A-Za-z0-9_]+",
    dataset=r"[A-Za-z0-9_.-]+",


def view(study):
    """The study's view of the config: shared sections + the study's own sections at top level."""
    return wf.view(config, study)


def job_config(*keys, study=True):
    """``params`` value: the job's ``--config FILE``. FILE holds exactly the listed sections (dotted keys;
    ``{role}``-style wildcards are filled in; a callable key returns a list of keys for the job's wildcards) and is named by their digest, so a config edit reruns exactly
    the jobs whose sections changed. ``study=False`` for shared jobs (tiny models, NLTK data)."""

    def value(wildcards):
        fill = dict(wildcards.items())
        names = []
        for k in keys:
            names += k(wildcards) if callable(k) else [k.format(**fill)]
        return wf.job_config_arg(config, wildcards.study if study else None, names)

    return value


def model_inputs(*roles):
    """Input function: local model folders of the roles (wildcards such as ``{role}`` filled in)."""

    def value(wildcards):
        fill = dict(wildcards.items())
        return wf.local_model_inputs(config, *[r.format(**fill) for r in roles])

    return value


def n_captions(study):
    return wf.caption_count(view(study))


def shards(study, stage):
    """Zero-padded shard ids covering the study's input captions at ``<stage>.shard_size`` per job."""
    return wf.shard_ids(n_captions(study), view(study)[stage]["shard_size"])


def per_shard(pattern, stage):
    """Input function: ``pattern`` (with {study} and {shard}) for every shard of ``stage``."""

    def value(wildcards):
        return expand(pattern, study=wildcards.study, shard=shards(wildcards.study, stage))

    return value


# Settings that change what a model computes on a device.
DEVICE_KEYS = ("device", "precision")
