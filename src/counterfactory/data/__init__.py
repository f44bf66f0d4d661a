"""Readers for source datasets in their official on-disk formats."""
