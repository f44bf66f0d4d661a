# Helpers shared by the rule files.
from pathlib import Path

# every rule runs in the project's one environment (`--software-deployment-method conda`)
CONDA_ENV = "../envs/counterfactory.yaml"


def shards(stage_size):
    """Zero-padded shard ids covering the input captions at ``stage_size`` captions per job."""
    return wf.shard_ids(N_CAPTIONS, stage_size)
