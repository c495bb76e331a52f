"""The engines directory: ``<root>/<voice>/<version>/`` with a manifest written last."""
