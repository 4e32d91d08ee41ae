"""Trials side by side: one worker thread per campaign (one per ``verify --sink``)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from sparkonce.errors import ConfigError
from sparkonce.verify.model import Fault, TrialOutcome

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.verify.campaign import Campaign


def run_trials(
    campaigns: Sequence[Campaign],
    trials: Iterable[int],
    on_start: Callable[[int, Fault], None] | None = None,
) -> Iterator[TrialOutcome]:
    """Run ``trials``, one at a time per campaign, and yield outcomes as they finish.

    Several campaigns are the same pipeline on separate test stores (``verify
    --sink A --sink B``): their trials run side by side. A trial's fault plan
    depends only on ``(seed, trial)`` and the shared oracle, so the result is the
    same campaign as a serial run, in another order. Leaving early (an error in
    a worker, or closing the iterator) kills the running drivers and starts no
    more trials.
    """
    if not campaigns:
        raise ConfigError("run_trials needs at least one campaign")
    oracle = campaigns[0].oracle
    if oracle is None or any(c.oracle is not oracle for c in campaigns):
        raise ConfigError("run the oracle first, and give every campaign the same oracle")
    pending = list(trials)
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for n in pending:
        todo.put(n)
    done: queue.SimpleQueue[TrialOutcome | BaseException] = queue.SimpleQueue()
    stop = threading.Event()

    def work(index: int, campaign: Campaign) -> None:
        while not stop.is_set():
            try:
                n = todo.get_nowait()
            except queue.Empty:
                return
            try:
                if on_start is not None:
                    on_start(n, campaign.plan(n))
                outcome = campaign.run_trial(n)
            except BaseException as exc:  # handed to the caller's thread
                done.put(exc)
                return
            outcome.worker = index
            done.put(outcome)

    threads = [
        threading.Thread(target=work, args=(i, c), name=f"verify-worker-{i}", daemon=True)
        for i, c in enumerate(campaigns)
    ]
    for t in threads:
        t.start()
    finished = False
    try:
        for _ in pending:
            item = done.get()
            if isinstance(item, BaseException):
                raise item
            yield item
        finished = True
    finally:
        stop.set()
        if not finished:  # an error or an early exit: no driver may outlive the campaign
            for c in campaigns:
                c.abort()
        for t in threads:
            t.join()
