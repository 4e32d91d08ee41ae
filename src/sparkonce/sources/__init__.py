"""Replayable sources: each micro-batch is a set of per-partition offset ranges."""

from sparkonce.sources.base import Source
from sparkonce.sources.embedded import EmbeddedLogSource

__all__ = ["EmbeddedLogSource", "Source"]
