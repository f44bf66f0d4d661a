"""SocialCounterfactuals (Howard et al., CVPR 2024): what only this paper needs.

Modules (each adds its own ``counterfactory social <step>`` subcommands through ``add_cli``):

* :mod:`.captions` — caption sets from the config's attribute and subject lists (§3.2, 8.4);
* :mod:`.filtering` — the three-stage filter (CLIP, NSFW, attribute detectability; §3.4, 8.3) and the
  threshold calibration;
* :mod:`.probing` — MaxSkew@K, NDKL and Bias@K per subject (§4, 10);
* :mod:`.debias` — the withheld-occupation split and the debiasing evaluation (§5, 8.2);
* :mod:`.release` — the dataset in the released layout (Intel/SocialCounterfactuals).
"""

from __future__ import annotations

STUDY = "social_counterfactuals"
#: the study's modules that contribute ``counterfactory social`` subcommands, in help order
CLI_MODULES = ("captions", "filtering", "probing", "debias", "release")
