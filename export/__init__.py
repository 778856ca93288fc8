"""Torch models, exporters and training recipes of the bundled models (the `export` extra)."""
