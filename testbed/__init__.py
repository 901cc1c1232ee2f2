"""Geo-distributed LLM training testbed: emulated datacenters, real PyTorch workers, Atlas and BubbleTea."""

__version__ = "0.1.0"
