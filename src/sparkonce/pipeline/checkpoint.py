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
from typing import TYPE_CHECKING

from sparkonce.errors import CheckpointError, ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.sources.base import Source


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

    def has_state(self) -> bool:
        """Whether the query keeps state in this checkpoint, as Spark itself records it.

        Spark writes ``state/<operator id>/`` (the operator's metadata) when it plans
        the first batch of a query with a stateful operator (aggregation, dedup,
        stream-stream join, limit, ``applyInPandasWithState``,
        ``transformWithStateInPandas``...), before the batch's sink runs. A stateless
        query never creates it.
        """
        state = self.path / "state"
        return state.is_dir() and any(p.name.isdigit() for p in state.iterdir())

    def check_usable(self) -> None:
        """Raise :class:`ConfigError` if the path cannot be a checkpoint directory."""
        p = self.path
        if p.exists() and not p.is_dir():
            raise ConfigError(
                f"checkpoint {p} is a file, not a directory. Operator action: point the "
                "pipeline's checkpoint (or --checkpoint) at a directory; it is created if missing"
            )
        parent = p if p.exists() else next((a for a in p.parents if a.exists()), None)
        if parent is None or not parent.is_dir():
            raise ConfigError(
                f"checkpoint {p}: {parent} is not a directory, so the checkpoint cannot be "
                "created there. Operator action: choose a path under an existing directory"
            )
        import os

        if not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(
                f"checkpoint {p}: {parent} is not writable by this user. Operator action: fix "
                "its permissions or choose another checkpoint directory"
            )

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
        # A stream-stream self-join reads the one source twice; both sides plan the same
        # ranges from the same log, and then the batch is those ranges.
        distinct = {_canonical(s) for s in sources}
        if len(distinct) != 1:
            raise CheckpointError(
                f"{f}: expected one streaming source, found {len(sources)} with different "
                "offsets. A sparkonce pipeline reads one source (a self-join of it is fine "
                "while both sides plan the same ranges); join other data as static tables."
            )
        return sources[0]

    def previous_offset(self, batch_id: int, source: Source) -> str | None:
        """Where ``batch_id`` starts: the batch before's offset, or for batch 0 the
        source's initial offset (None for sources whose offsets hold whole ranges)."""
        if batch_id > 0:
            return self.source_offset(batch_id - 1)
        return source.initial_offset(self.path)


def _canonical(offset: str) -> str:
    try:
        return json.dumps(json.loads(offset), sort_keys=True)
    except ValueError:
        return offset
