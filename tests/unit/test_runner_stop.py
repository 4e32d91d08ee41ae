"""A stop request (SIGTERM, SIGINT) stops the query between commits, and never deadlocks.

Spark's ``query.stop()`` interrupts the query's batch thread and waits for it to end. If
that thread has just started the next batch, it is inside the ``foreachBatch`` handler,
which takes the handler's lock. The stopper must not hold that lock while it waits for
Spark, or neither thread ever moves: the run hangs after the signal, says nothing, and is
killed (seen once in the crash lane, under load, as ``test_stop[SIGTERM]``).

The query here stands in for Spark's: its ``stop()`` runs the next batch on a thread of
its own and waits for it, as ``StreamExecution.stop`` waits for the batch thread.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest

from sparkonce.errors import RunStopped
from sparkonce.pipeline import runner
from sparkonce.pipeline.runner import _BatchHandler


class _StoppingQuery:
    """``stop()`` starts the next batch (which calls the handler) and waits for it."""

    def __init__(self, handler: _BatchHandler, wait_s: float) -> None:
        self.handler = handler
        self.wait_s = wait_s
        self.batch_outcome: list[BaseException | None] = []
        self.batch_ended = threading.Event()

    def _next_batch(self) -> None:
        try:
            self.handler(cast(Any, None), 7)
            self.batch_outcome.append(None)
        except BaseException as exc:
            self.batch_outcome.append(exc)
        finally:
            self.batch_ended.set()

    def stop(self) -> None:
        batch = threading.Thread(target=self._next_batch, daemon=True)
        batch.start()
        batch.join(self.wait_s)


def _handler() -> _BatchHandler:
    pipeline = SimpleNamespace(name="stopping", stateful=False)
    handler = _BatchHandler(cast(Any, pipeline), 1, cast(Any, None), cast(Any, None), None)

    def must_not_commit(_df: object, batch_id: int) -> None:
        raise AssertionError(f"batch {batch_id} was committed after the stop request")

    handler._commit = must_not_commit  # type: ignore[method-assign,assignment]
    return handler


def test_a_batch_starting_during_the_stop_raises_the_stop_instead_of_waiting() -> None:
    handler = _handler()
    query = _StoppingQuery(handler, wait_s=10.0)
    why = RunStopped("stopped on SIGTERM", 15)

    handler.stop_between_batches(cast(Any, query), why)

    assert query.batch_ended.wait(0), "the batch started during the stop never ended"
    assert query.batch_outcome == [why], "the batch must raise the stop, and commit nothing"


def test_a_commit_in_flight_ends_before_the_query_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stop waits for the commit that runs (it holds the lock), then stops the query."""
    monkeypatch.setattr(runner, "STOP_WAIT_S", 10.0)
    handler = _handler()
    events: list[str] = []
    in_commit = threading.Event()

    def slow_commit(_df: object, batch_id: int) -> None:
        in_commit.set()
        time.sleep(0.5)
        events.append(f"committed {batch_id}")

    handler._commit = slow_commit  # type: ignore[method-assign,assignment]
    committing = threading.Thread(target=handler, args=(None, 6), daemon=True)
    committing.start()
    assert in_commit.wait(5)

    class Query:
        def stop(self) -> None:
            events.append("query stopped")

    handler.stop_between_batches(cast(Any, Query()), RunStopped("stopped on SIGINT", 2))
    committing.join(5)
    assert events == ["committed 6", "query stopped"]
