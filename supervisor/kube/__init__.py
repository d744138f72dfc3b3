"""A small Kubernetes client for trio: httpx for requests, the official loaders for config.

This ``__init__`` imports nothing, so importing a submodule stays cheap.
"""
