"""Exports of the generated data in the published release layouts and a generic Hugging Face layout
(:mod:`.formats`), a study's export given its declaration (:mod:`.studies`: :class:`StudyExport`; each study declares
its own in ``counterfactory.studies.<study>.export``, ``SPEC.export``), and dataset cards from provenance
(:mod:`.cards`)."""

from .formats import (ExportTable, read_manifest, write_coco_counterfactuals, write_countercurate, write_imagefolder,
                      write_parquet, write_social_counterfactuals)
from .studies import StudyExport

__all__ = ["ExportTable", "StudyExport", "read_manifest", "write_coco_counterfactuals", "write_countercurate",
           "write_imagefolder", "write_parquet", "write_social_counterfactuals"]
