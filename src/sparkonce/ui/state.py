"""What ``sparkonce ui`` shows, as plain JSON-ready dicts: no web code here.

Everything is read through the public sink API (``pipelines()``, ``owner()``,
``ledger()``) and :func:`~sparkonce.pipeline.status.pipeline_status`, the same reads as
``sparkonce status``:

- :func:`pipeline_view`: one pipeline's owner, last batch, rows, lag per partition, and its
  recent ledger entries with what can honestly be derived from them;
- :class:`StoreWatch`: one store (one ``--sink`` URL), opened lazily, reopened after a
  failure; :meth:`StoreWatch.read` never raises: a store that fails is a dict with
  ``status: "error"`` and a message (its password masked);
- :func:`load_verify_report`: the summary of a ``verify.json`` (raises ``ConfigError`` when
  it is missing or unreadable); :func:`verify_view` the same, never raising;
- :class:`UiState`: one polling thread per store, and :meth:`UiState.snapshot`, the document
  that ``/api/state`` serves.

Commit latency is what each ledger entry records (``commit_s``: its
:attr:`~sparkonce.ledger.base.LedgerEntry.commit_seconds`, None for an entry written by a
sparkonce that did not record it). Throughput is derived: **rows per second between
commits** (``rows_per_s``: the entry's rows over the time since the previous commit,
``interval_s``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkonce.config import mask_url
from sparkonce.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.ledger.base import LedgerEntry, LedgerReader

log = logging.getLogger(__name__)

RECENT = 50  # ledger entries in the timeline and the charts

# Opens a store's ledger from its URL: (the opened ledger, its label with the password
# masked); sparkonce.pipeline.status.open_status_sink.
Opener = Callable[[str], "tuple[LedgerReader, str]"]

# The keys of one fault kind's line in verify.json's "summary" (verify/summary.py
# KindSummary); the ones the page shows.
VERIFY_KEYS = (
    "kind",
    "trials",
    "passed",
    "fired",
    "lost_rows",
    "duplicated_rows",
    "value_mismatches",
    "recovery_mean_s",
    "recovery_p95_s",
)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


# -- one pipeline ----------------------------------------------------------------------------


def timeline(entries: Sequence[LedgerEntry], recent: int = RECENT) -> list[dict[str, Any]]:
    """The newest ``recent`` ledger entries, oldest first, each with what follows from it
    and the entry before it (the one before the first shown is used when there is one).

    ``commit_s``: how long the entry's commit took, as the ledger recorded it.
    ``interval_s``: seconds between the previous entry's ``committed_at`` and this one's
    (None for the ledger's first entry). ``rows_per_s``: this entry's rows (written to the
    sink) over that interval, ``records_per_s`` its input records (its offset ranges) over
    it (both None without an interval, or when it is not positive). ``epoch_changed``:
    this entry was committed by another epoch than the previous one (a restart or a
    takeover; its interval then includes the time the pipeline was down).
    """
    start = max(0, len(entries) - recent)
    out: list[dict[str, Any]] = []
    for i in range(start, len(entries)):
        e = entries[i]
        prev = entries[i - 1] if i > 0 else None
        interval = None if prev is None else (e.committed_at - prev.committed_at).total_seconds()
        out.append(
            {
                "seq": e.seq,
                "epoch": e.epoch,
                "rows": e.row_count,
                "records": e.ranges.count,
                "spark_batch_id": e.spark_batch_id,
                "committed_at": _iso(e.committed_at),
                "commit_s": e.commit_seconds,
                "interval_s": interval,
                "rows_per_s": e.row_count / interval if interval and interval > 0 else None,
                "records_per_s": e.ranges.count / interval if interval and interval > 0 else None,
                "epoch_changed": prev is not None and prev.epoch != e.epoch,
            }
        )
    return out


def pipeline_view(sink: LedgerReader, pipeline: str, recent: int = RECENT) -> dict[str, Any]:
    """One pipeline in ``sink``'s store: owner, last batch, rows, lag, recent entries."""
    from sparkonce.pipeline.status import pipeline_status

    entries = sink.ledger(pipeline)
    st = pipeline_status(sink, pipeline, entries)
    last = entries[-1] if entries else None
    return {
        "name": pipeline,
        "owner": None
        if st.owner is None
        else {
            "epoch": st.owner.epoch,
            "holder": st.owner.holder,
            "acquired_at": _iso(st.owner.acquired_at),
            "source": None if st.owner.source is None else mask_url(st.owner.source),
        },
        "batches": st.batches,
        "rows_committed": st.rows_committed,
        "last_batch": None
        if last is None
        else {
            "seq": last.seq,
            "epoch": last.epoch,
            "spark_batch_id": last.spark_batch_id,
            "committed_at": _iso(last.committed_at),
            "rows": last.row_count,
        },
        "partitions": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "committed": p.committed,
                "latest": p.latest,
                "lag": p.lag,
            }
            for p in st.partitions
        ],
        "total_lag": st.total_lag,
        "source_note": mask_url(st.source_note),
        "ledger_problems": list(st.ledger_problems),
        "timeline": timeline(entries, recent),
    }


# -- one store -------------------------------------------------------------------------------


def _safe_message(exc: BaseException, url: str, label: str) -> str:
    """``exc``'s message with the URL's password masked wherever the URL or it appears."""
    text = str(exc) or type(exc).__name__
    text = text.replace(url, label)
    secret = _password(url)
    if secret:
        text = text.replace(secret, "***")
    return mask_url(text)


def _password(url: str) -> str | None:
    from urllib.parse import unquote, urlsplit

    try:
        raw = urlsplit(url).password
    except ValueError:
        return None
    return unquote(raw) if raw else None


class StoreWatch:
    """One store the page shows, read through the sink that ``opener`` opens from ``url``.

    The sink is opened on the first read (or by :meth:`probe`) and kept open; after any
    failure it is closed, and the next read opens it again.
    """

    def __init__(self, url: str, opener: Opener, recent: int = RECENT) -> None:
        self.url = url
        self.label = mask_url(url)
        self.recent = recent
        self._opener = opener
        self._sink: LedgerReader | None = None
        self._failed_probe: Exception | None = None
        self._opened = False  # the store was opened once

    def __repr__(self) -> str:
        return f"StoreWatch({self.label})"

    def waiting_for(self) -> str | None:
        """The SQLite file this store is, while it does not exist yet (a run creates it
        when it first opens its sink); None for any other store, or once it existed (a
        file gone after it was read is an error)."""
        from sparkonce.config import StoreURL

        if self._opened or not self.url.startswith("sqlite:"):
            return None
        try:
            path = StoreURL.parse(self.url).path
        except ConfigError:
            return None
        return None if path is None or path.exists() else str(path)

    def probe(self) -> None:
        """Open the store now; raises what the opener raises (the CLI's start check).

        A failure is also kept as the first reading's result, so the page shows it at once
        instead of trying the store again (a PostgreSQL server that does not answer takes
        seconds of retries). A SQLite file that does not exist yet is not opened: it is
        waited for (:meth:`waiting_for`).
        """
        if self.waiting_for() is not None:
            return
        try:
            self._open()
        except Exception as exc:
            self._failed_probe = exc
            raise

    def _open(self) -> LedgerReader:
        if self._sink is None:
            self._sink, self.label = self._opener(self.url)
            self._opened = True
        return self._sink

    def read(self) -> dict[str, Any]:
        """This store's pipelines (``status`` "ok"), none ("empty"), a SQLite file that does
        not exist yet ("waiting", with ``waiting_for`` its path), or what went wrong
        ("error", with ``error`` the message and ``error_type`` the exception's class)."""
        started = time.monotonic()
        base: dict[str, Any] = {"label": self.label, "read_at": _iso(datetime.now(UTC))}
        waiting = self.waiting_for()
        if waiting is not None:
            return {
                **base,
                "status": "waiting",
                "waiting_for": waiting,
                "error": None,
                "error_type": None,
                "pipelines": [],
                "read_s": round(time.monotonic() - started, 3),
            }
        try:
            failed, self._failed_probe = self._failed_probe, None
            if failed is not None:
                raise failed
            sink = self._open()
            names = sorted(sink.pipelines())
            views = [pipeline_view(sink, name, self.recent) for name in names]
        except Exception as exc:  # any failure is shown on the page, never raised
            self.close()
            return {
                **base,
                "label": self.label,
                "status": "error",
                "error": _safe_message(exc, self.url, self.label),
                "error_type": type(exc).__name__,
                "pipelines": [],
                "read_s": round(time.monotonic() - started, 3),
            }
        return {
            **base,
            "label": self.label,
            "status": "ok" if views else "empty",
            "error": None,
            "error_type": None,
            "pipelines": views,
            "read_s": round(time.monotonic() - started, 3),
        }

    def close(self) -> None:
        sink, self._sink = self._sink, None
        if sink is not None:
            with contextlib.suppress(Exception):  # closing a broken connection may fail too
                sink.close()


# -- the verify report -------------------------------------------------------------------------


def load_verify_report(path: Path) -> dict[str, Any]:
    """The summary of the ``verify.json`` at ``path`` (written by ``sparkonce verify``).

    Read with the report's codec (:class:`~sparkonce.verify.report.VerifyReport`). Raises
    :class:`ConfigError` naming the path when it is missing, not JSON, not a verify report
    (no ``summary`` list of fault kinds, or trials this version cannot read), and
    :class:`~sparkonce.errors.RecordVersionError` (one) for a report of a newer version.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(
            f"verify report {str(path)!r} does not exist; give the verify.json that "
            "`sparkonce verify --out DIR` wrote (DIR/verify.json)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"verify report {str(path)!r} cannot be read: {exc}") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"verify report {str(path)!r} is not JSON ({exc})") from None
    from sparkonce.verify.report import VerifyReport

    try:
        report = VerifyReport.decode(doc if isinstance(doc, dict) else {}, repr(str(path)))
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        if isinstance(exc, ConfigError):  # a newer version: its own message
            raise
        raise ConfigError(
            f"verify report {str(path)!r} is not a report this sparkonce can read ({exc})"
        ) from None
    summary = doc.get("summary") if isinstance(doc, dict) else None
    if not isinstance(summary, list) or not all(
        isinstance(s, dict) and isinstance(s.get("kind"), str) for s in summary
    ):
        raise ConfigError(
            f"verify report {str(path)!r} is not a report of `sparkonce verify` "
            "(it has no 'summary' list of fault kinds)"
        )
    return {
        "path": str(path),
        "modified_at": _iso(datetime.fromtimestamp(path.stat().st_mtime, UTC)),
        "pipeline": report.pipeline,
        "seed": report.seed,
        "faults": doc.get("faults"),
        "trials": len(report.trials),
        "failed": sum(1 for t in report.trials if not t.passed),
        "summary": [{k: s.get(k) for k in VERIFY_KEYS} for s in summary],
        "error": None,
    }


def verify_view(path: Path | None) -> dict[str, Any] | None:
    """:func:`load_verify_report`, or a dict with its ``error`` (None without a path)."""
    if path is None:
        return None
    try:
        return load_verify_report(path)
    except ConfigError as exc:
        return {"path": str(path), "error": str(exc), "summary": []}


def _log_change(before: str | None, view: dict[str, Any]) -> None:
    """One log line when a store fails, and one when it is readable again (not per read)."""
    if view["status"] == "error" and before != "error":
        log.warning("%s: %s: %s", view["label"], view["error_type"], view["error"])
    elif before == "error" and view["status"] != "error":
        log.warning("%s: readable again", view["label"])
    elif view["status"] == "waiting" and before != "waiting":
        log.warning(
            "%s: waiting for %s, which does not exist yet (a run creates it)",
            view["label"],
            view["waiting_for"],
        )
    elif before == "waiting" and view["status"] != "waiting":
        log.warning("%s: the file exists now; reading it", view["label"])


# -- the whole page ------------------------------------------------------------------------------


class UiState:
    """The stores and the verify report the page shows, kept fresh by one thread per store.

    :meth:`start` starts the threads; each reads its store every ``refresh_s`` seconds, so
    a slow or unreachable store never delays the others or the page. :meth:`snapshot` is
    the latest of everything (a store not read yet has ``status: "loading"``).
    """

    def __init__(
        self,
        watches: Sequence[StoreWatch],
        verify_report: Path | None = None,
        refresh_s: float = 2.0,
    ) -> None:
        self.watches = list(watches)
        self.verify_report = verify_report
        self.refresh_s = refresh_s
        self._latest: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for i, watch in enumerate(self.watches):
            t = threading.Thread(
                target=self._poll, args=(i, watch), name=f"sparkonce-ui-store-{i}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def _poll(self, index: int, watch: StoreWatch) -> None:
        while not self._stop.is_set():
            view = watch.read()
            with self._lock:
                before = self._latest.get(index, {}).get("status")
                self._latest[index] = view
            _log_change(before, view)
            self._stop.wait(self.refresh_s)
        watch.close()

    def read_now(self) -> None:
        """Read every store once in this thread (without :meth:`start`)."""
        for i, watch in enumerate(self.watches):
            view = watch.read()
            with self._lock:
                self._latest[i] = view

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the threads; one still inside a slow reading is left to end with the
        process (they are daemon threads)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            stores = [
                self._latest.get(i)
                or {"label": w.label, "status": "loading", "error": None, "pipelines": []}
                for i, w in enumerate(self.watches)
            ]
        return {
            "generated_at": _iso(datetime.now(UTC)),
            "refresh_s": self.refresh_s,
            "recent": self.watches[0].recent if self.watches else RECENT,
            "stores": stores,
            "verify": verify_view(self.verify_report),
        }
