"""``sparkonce ui``: a live status page of the pipelines in one or more stores.

Checks at start (each a ``bad input``, exit 2, unless said otherwise): the ``ui`` extra
(Flask, werkzeug, plotly) is installed; every ``--sink``
URL's form; the ``--verify-report`` (missing, not JSON, not a verify report); a ``--port``
already in use. Each store is then opened once: a store that does not answer is only a
warning (the page shows its error) unless none answers, which exits 4. A SQLite file that
does not exist yet is waited for: the page says so, and reads it once a run creates it.
Once serving, nothing a store does stops the page: each store's error is shown in its own
section. SIGINT and SIGTERM stop the server (exit 130 and 143).
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from sparkonce.cli.common import (
    FILE_EXPECTED,
    SINK_URL_EXPECTED,
    _add_env_number,
    _check_env,
    _check_file,
    _check_sink_url,
    _env,
    _env_checked,
    _help,
    _typed,
)
from sparkonce.errors import ConfigError, RunStopped, StoreUnavailableError

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.cli.common import SubParsers
    from sparkonce.ui.state import UiState

HOST = "127.0.0.1"


def cmd_ui(args: argparse.Namespace) -> int:
    from sparkonce.config import mask_url
    from sparkonce.pipeline.status import open_status_sink
    from sparkonce.ui.app import require_ui
    from sparkonce.ui.state import StoreWatch, UiState, load_verify_report

    require_ui()  # ImportError naming the extra: exit 2

    env_sink = _env("SPARKONCE_SINK")
    if not args.sink:
        _check_env(env_sink, "--sink", SINK_URL_EXPECTED, _check_sink_url, secret=True)
    urls: list[str] = list(args.sink or ([env_sink] if env_sink else []))
    if not urls:
        raise ConfigError("--sink is required (or set SPARKONCE_SINK); give it once per store")
    for url in urls:
        try:
            _check_sink_url(url)
        except ConfigError as exc:
            raise ConfigError(
                f"--sink {mask_url(url)!r}: {exc}; expected {SINK_URL_EXPECTED}"
            ) from None
    report = Path(args.verify_report) if args.verify_report else None
    if report is not None:
        load_verify_report(report)  # ConfigError: missing or not a report

    watches = [StoreWatch(url, open_status_sink) for url in urls]
    unreachable: list[StoreUnavailableError] = []
    try:
        for watch in watches:
            try:
                watch.probe()  # ConfigError stops here: exit 2
            except StoreUnavailableError as exc:  # shown, and logged, as its first reading
                unreachable.append(exc)
        if unreachable and len(unreachable) == len(watches):
            raise unreachable[0]
        # A SQLite file that does not exist yet was not opened: the page, and one log line
        # (sparkonce.ui.state), say that it is waited for.
    except Exception:
        for watch in watches:
            watch.close()
        raise

    state = UiState(watches, report, refresh_s=args.refresh)
    # From now on a store that fails is shown on the page and logged once when it fails
    # (sparkonce.ui.state), not once per connection attempt of every reading.
    db_log = logging.getLogger("sparkonce.db")
    level = db_log.level
    db_log.setLevel(logging.ERROR)
    try:
        return _serve(state, args.port)
    finally:
        db_log.setLevel(level)
        for watch in watches:
            watch.close()


def _serve(state: UiState, port: int) -> int:
    """Serve the page until SIGINT or SIGTERM; raises :class:`RunStopped` then."""
    from werkzeug.serving import make_server

    from sparkonce.ui.app import create_app

    app = create_app(state)
    # werkzeug logs every request (a poll every few seconds): only its warnings and errors.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    # Bound here, not by make_server(), which prints and exits on a port in use.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, port))
        listener.listen(128)
    except OSError as exc:
        listener.close()
        raise ConfigError(
            f"cannot listen on {HOST}:{port} ({exc.strerror or exc}); choose another --port, "
            "or --port 0 for any free one"
        ) from None
    with listener:  # make_server() serves a duplicate of its descriptor
        server = make_server(
            HOST, listener.getsockname()[1], app, threaded=True, fd=listener.fileno()
        )
    stopped: list[int] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        stopped.append(signum)
        # shutdown() waits for serve_forever() to return: not from the thread running it.
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    state.start()
    print(f"sparkonce ui: serving http://{HOST}:{server.port}/", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        server.server_close()
        state.stop()
    signum = stopped[0] if stopped else signal.SIGTERM
    raise RunStopped(f"sparkonce ui stopped on {signal.Signals(signum).name}", signum)


def _check_refresh(value: float) -> bool:
    return 0.2 <= value <= 3600


def add_parser(sub: SubParsers) -> None:
    p = sub.add_parser(
        "ui",
        help="a live status page of the pipelines in one or more stores (127.0.0.1)",
        description="Serve a page on 127.0.0.1 that shows every pipeline in the given stores "
        "(owner epoch, last batch, rows committed, lag per partition, recent ledger entries, "
        "rows per second, commit latency) and the summary of a verify report, "
        "refreshed every --refresh seconds. Needs the ui extra: pip install 'sparkonce[ui]'.",
    )
    p.add_argument(
        "--sink",
        action="append",
        default=None,
        metavar="URL",
        help=_help(
            "a store to watch, as a sink URL (sqlite:///PATH.db, postgresql://USER@HOST:PORT/DB, "
            "kafka://HOST:PORT/TOPIC, delta:///ROOT/TABLE, the Delta table's own directory, or "
            "iceberg+sqlite:////ABS/catalog.db?table=NS.NAME&catalog=NAME); "
            "give it once per store; a SQLite file that does not exist yet is waited for",
            "SPARKONCE_SINK, one store",
        ),
    )
    p.add_argument(
        "--verify-report",
        type=_env_checked("--verify-report", FILE_EXPECTED, _check_file),
        default=_env("SPARKONCE_UI_VERIFY_REPORT"),
        metavar="PATH",
        help=_help(
            "the verify.json of a `sparkonce verify` campaign, read again on every refresh",
            "SPARKONCE_UI_VERIFY_REPORT",
        ),
    )
    _add_env_number(
        p,
        "--port",
        env="SPARKONCE_UI_PORT",
        default=8765,
        help="port on 127.0.0.1, default 8765 (0: any free port, printed at start)",
        minimum=0,
        maximum=65535,
    )
    p.add_argument(
        "--refresh",
        type=_typed(float, "--refresh", "a number of seconds in 0.2..3600", _check_refresh),
        default=_env("SPARKONCE_UI_REFRESH", "2"),
        metavar="SECONDS",
        help=_help("seconds between readings of each store, default 2", "SPARKONCE_UI_REFRESH"),
    )
    p.set_defaults(func=cmd_ui)
