"""The export signature: the `serving_default` function a SavedModel is exported with.

The Exporter (components/exporter.py) wraps a trained encoder and decoder in
`export.CaptionModule`, whose signature (image bytes or annotation grids in;
captions, tokens, per-word attention maps out) is the contract every server
and client of this project speaks (docs/serving.md, "The signature").
Imports `models` and nothing else of `serving`.
"""
