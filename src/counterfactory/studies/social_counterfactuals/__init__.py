"""SocialCounterfactuals (Howard et al., CVPR 2024): what only this paper needs.

Modules (library code only; the ``counterfactory social <step>`` subcommands that call them live in
:mod:`counterfactory.commands.social`):

* :mod:`.captions` — caption sets from the config's attribute and subject lists (§3.2, 8.4);
* :mod:`.filtering` — the three-stage filter (CLIP, NSFW, attribute detectability; §3.4, 8.3) and the
  threshold calibration (kernels in :mod:`counterfactory.filters`), with :mod:`.filter_io` (its table files)
  and :mod:`.filter_table` (Table 11);
* :mod:`.probing` — MaxSkew@K, NDKL and Bias@K per subject (§4, 10), with :mod:`.probe_report` (its
  tables and figures);
* :mod:`.external` — the same metrics on real image-text data, PATA and VisoGender (§5.3, Table 3);
* :mod:`.debias` — the withheld-occupation split and the debiasing evaluation (§5, 8.2), with
  :mod:`.debias_tables` (Tables 2, 3, 16, 17) and :mod:`.task_eval` (Tables 4, 5: retrieval and zero-shot accuracy
  of the debiased models through the shared evaluation);
* the dataset in the released layout (Intel/SocialCounterfactuals) is written by the shared export stage
  (:mod:`counterfactory.export.social_release`).
"""

from __future__ import annotations

import functools

from ...settings import seed_pairs

STUDY = "social_counterfactuals"

#: probing runs on the data before the NSFW / detectability stages (§4.2) and after them (§10)
PROBE_STAGES = ("before", "after")


def n_sets(view) -> int:
    """Caption sets the config yields (prefixes x subjects x segments), without building the captions."""
    import json

    return _n_sets(json.dumps(view.get("captions"), sort_keys=True, default=str))


@functools.lru_cache(maxsize=16)
def _n_sets(section_json: str) -> int:
    import json

    from .captions import resolve_section

    section = resolve_section(json.loads(section_json))
    return len(section["prefixes"]) * len(section["subjects"]) * len(section["segments"])


def targets(view, results: str) -> list[str]:
    """Every final file of the study under ``results`` (``results/<run>/social_counterfactuals``)."""
    # a downloaded release (`release.root`) holds the filtered sets only (§3.4): no Table 11, no "before" probe
    release = (view.get("release") or {}).get("root")
    # (the Intel/SocialCounterfactuals parquet layout of the kept images is written by the shared export_release)
    out = [] if release else [f"{results}/filter/table11.md",
                              f"{results}/generation/adaptive_curve.csv"]   # over-generation trade-off (issue 16)
    from .image_quality import settings as image_quality

    if not release and image_quality(view)["enabled"]:
        out.append(f"{results}/image_quality/table.md")   # §10.3
    stages = ("after",) if release else PROBE_STAGES
    if view.get("probing", {}).get("roles"):
        out += [f"{results}/probing/{stage}/tables.md" for stage in stages]
        out += [f"{results}/probing/{stage}/figures" for stage in stages]
    if view.get("debias", {}).get("roles"):
        out.append(f"{results}/debias/tables.md")
        if (view["debias"].get("task_eval") or {}).get("roles"):   # §5.3, Tables 4 and 5
            out.append(f"{results}/debias/task_tables.md")
    return out


def debias_segments(view) -> list[str]:
    """Segments of the debiasing runs: ``debias.segments``, else every two-attribute segment (Table 1)."""
    from .captions import resolve_section, segment_name

    if view["debias"].get("segments"):
        return list(view["debias"]["segments"])
    return [segment_name(types) for types in resolve_section(view.get("captions"))["segments"] if len(types) == 2]


def debias_seeds(view) -> dict[int, int]:
    """seed -> data seed of the debiasing runs."""
    return dict(seed_pairs(view["debias"]["seeds"]))
