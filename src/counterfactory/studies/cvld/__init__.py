"""CVLD (debiasing VLMs with counterfactuals): gender interventions by image editing, debiased adaptation of BLIP."""
