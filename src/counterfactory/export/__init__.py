"""Exports of the generated data in the published release layouts and a generic Hugging Face layout
(:mod:`.formats`), what each study exports (:mod:`.studies`), and dataset cards from provenance (:mod:`.cards`)."""

from .formats import (ExportTable, read_manifest, write_coco_counterfactuals, write_countercurate, write_imagefolder,
                      write_parquet, write_social_counterfactuals)
from .studies import STUDIES, StudyExport, study_export

__all__ = ["ExportTable", "STUDIES", "StudyExport", "read_manifest", "study_export", "write_coco_counterfactuals",
           "write_countercurate", "write_imagefolder", "write_parquet", "write_social_counterfactuals"]
