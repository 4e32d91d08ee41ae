"""Reading Spark's streaming checkpoint: the offset log and the query id.

Spark writes ``<checkpoint>/offsets/<batchId>`` *before* it runs a batch (the
batch's source offsets, our offset ranges) and ``<checkpoint>/commits/<batchId>``
after the batch's sink finished. sparkonce reads the offset log to learn which
ranges a batch covers; it never trusts the checkpoint for progress (the ledger
is the truth).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sparkonce.errors import CheckpointError


@dataclass(frozen=True)
class Checkpoint:
    """A local checkpoint directory."""

    path: Path

    @property
    def is_new(self) -> bool:
        """True when Spark has never planned a batch here (missing or empty offset log)."""
        offsets = self.path / "offsets"
        return not offsets.is_dir() or not any(p.name.isdigit() for p in offsets.iterdir())

    def query_id(self) -> str | None:
        meta = self.path / "metadata"
        if not meta.exists():
            return None
        try:
            return str(json.loads(meta.read_text().splitlines()[0])["id"])
        except (ValueError, KeyError, IndexError) as exc:
            raise CheckpointError(f"{meta} is not a Spark checkpoint metadata file: {exc}") from exc

    def batch_ids(self, kind: str = "offsets") -> list[int]:
        d = self.path / kind
        if not d.is_dir():
            return []
        return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit())

    def last_committed_batch(self) -> int | None:
        ids = self.batch_ids("commits")
        return ids[-1] if ids else None

    def source_offset(self, batch_id: int) -> str | None:
        """The serialized source offset Spark planned for ``batch_id`` (None if purged)."""
        f = self.path / "offsets" / str(batch_id)
        if not f.exists():
            return None
        lines = f.read_text().splitlines()
        if not lines or not lines[0].startswith("v"):
            raise CheckpointError(f"{f}: unknown offset log format (first line {lines[:1]})")
        sources = [ln for ln in lines[2:] if ln.strip()]
        if len(sources) != 1:
            raise CheckpointError(
                f"{f}: expected exactly one streaming source, found {len(sources)}. "
                "A sparkonce pipeline reads one source; join other data as static tables."
            )
        return sources[0]
