"""Column layouts of the COCO-Counterfactuals stage outputs that readers of the public release also write.

The caption stage (:mod:`counterfactory.text.caption_stage`) and the image stage
(:mod:`counterfactory.generation.shards`) write these tables; :mod:`counterfactory.data.releases` turns the
published release into the same tables, so downstream steps read both alike. Kept in the data layer so the
release readers need not import the stages.
"""

#: accepted caption pairs (``captions/accepted.parquet``)
ACCEPTED_COLUMNS = ["caption_id", "source_index", "image_id", "original", "counterfactual", "original_word",
                    "new_word", "position", "similarity", "perplexity"]

#: selected image pairs (``images/selected_pairs.parquet``): column -> pandas dtype
SELECTED_SCHEMA = {
    "id": "object", "caption_0": "object", "caption_1": "object", "image_0": "object", "image_1": "object",
    "caption_id": "object", "source_index": "int64", "image_id": "object", "original_word": "object",
    "new_word": "object", "rank": "int64", "candidate_index": "int64", "seed": "uint64", "p": "float64",
    "guidance": "float64", "sim_0": "float64", "sim_1": "float64", "sim_image": "float64",
    "sim_direction": "float64",
}
