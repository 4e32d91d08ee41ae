"""Watching a run: the hooks a run calls, and what hangs on them.

:mod:`.base` holds the contract, :class:`RunObserver` (the hooks the runner calls, and
where and when each runs), and :class:`~sparkonce.observe.base.RunWatch`, which the runner
drives for one run: the observer's hooks, the lag thread and Spark's query listener.
Two observers are built on it, each created only when asked for:

- :mod:`.metrics`: Prometheus metrics (``sparkonce run --metrics-port``); needs the
  ``metrics`` extra, ``pip install 'sparkonce[metrics]'``;
- :mod:`.progress`: the live progress display of ``sparkonce run`` on a terminal (rich).

The runner imports only :mod:`.base`, so a run without an observer changes nothing and
needs neither prometheus_client nor a terminal.
"""

from sparkonce.observe.base import Observers, RunObserver, RunStart

__all__ = ["Observers", "RunObserver", "RunStart"]
