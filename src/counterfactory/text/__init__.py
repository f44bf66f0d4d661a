"""Caption text processing: tokenising, POS tagging and counterfactual caption edits."""
