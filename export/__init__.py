"""Torch model definitions and exporters for the reference bundle (needs the `export` extra)."""
