"""Facts a dataset card states that other exports state too (the SocialCounterfactuals parquet release's own
card): the papers' BibTeX entries and the Hub's size buckets. Kept apart from :mod:`.cards` so that an export
format can use them without importing the card builder (which imports the formats)."""

from __future__ import annotations

SIZE_BOUNDS = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
               (10_000_000, "1M<n<10M"))

#: the papers' BibTeX entries (the card's Citation section)
CITATIONS = {
    "coco_counterfactuals": """@inproceedings{le2023cococounterfactuals,
  title     = {{COCO}-Counterfactuals: Automatically Constructed Counterfactual Examples for Image-Text Pairs},
  author    = {Le, Tiep and Lal, Vasudev and Howard, Phillip},
  booktitle = {Advances in Neural Information Processing Systems (Datasets and Benchmarks Track)},
  year      = {2023},
  eprint    = {2309.14356},
  archivePrefix = {arXiv}
}""",
    "social_counterfactuals": """@inproceedings{howard2024socialcounterfactuals,
  title     = {{SocialCounterfactuals}: Probing and Mitigating Intersectional Social Biases in Vision-Language
               Models with Counterfactual Examples},
  author    = {Howard, Phillip and Madasu, Avinash and Le, Tiep and Lujan Moreno, Gustavo and
               Bhiwandiwalla, Anahita and Lal, Vasudev},
  booktitle = {Proceedings of the IEEE/CVF Conference on Computer Vision and Pattern Recognition (CVPR)},
  year      = {2024},
  eprint    = {2312.00825},
  archivePrefix = {arXiv}
}""",
    "countercurate": """@inproceedings{zhang2024countercurate,
  title     = {{CounterCurate}: Enhancing Physical and Semantic Visio-Linguistic Compositional Reasoning via
               Counterfactual Examples},
  author    = {Zhang, Jianrui and Cai, Mu and Xie, Tengyang and Lee, Yong Jae},
  booktitle = {Findings of the Association for Computational Linguistics: ACL 2024},
  year      = {2024},
  eprint    = {2402.13254},
  archivePrefix = {arXiv}
}""",
    "spurious_retrieval": """@inproceedings{kim2023spurious,
  title     = {Exposing and Mitigating Spurious Correlations for Cross-Modal Retrieval},
  author    = {Kim, Jae Myung and Koepke, A. Sophia and Schmid, Cordelia and Akata, Zeynep},
  booktitle = {Proceedings of the IEEE/CVF Conference on Computer Vision and Pattern Recognition Workshops},
  year      = {2023},
  eprint    = {2304.03114},
  archivePrefix = {arXiv}
}""",
    "cvld": """@misc{cvld,
  title = {Debias Your {VLM} with Counterfactuals: A Unified Approach},
  note  = {Anonymous authors, under review; cite the final version once published}
}""",
}


def size_category(n: int) -> str:
    """The Hub's ``size_categories`` bucket of ``n`` rows."""
    return next((label for bound, label in SIZE_BOUNDS if n < bound), "n>10M")
