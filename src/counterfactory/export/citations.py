"""Facts a dataset card states that other exports state too (the SocialCounterfactuals parquet release's own
card): the Hub's size buckets. Kept apart from :mod:`.cards` so that an export format can use them without importing
the card builder (which imports the formats). The papers' BibTeX entries are each study's own
(``StudyExport.citation``, in ``counterfactory.studies.<study>.export``)."""

from __future__ import annotations

SIZE_BOUNDS = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
               (10_000_000, "1M<n<10M"))

def size_category(n: int) -> str:
    """The Hub's ``size_categories`` bucket of ``n`` rows."""
    return next((label for bound, label in SIZE_BOUNDS if n < bound), "n>10M")
