"""The web layer of ``sparkonce ui``: a Flask app over a :class:`~sparkonce.ui.state.UiState`.

Routes (all read-only, served on 127.0.0.1 by the CLI):

- ``/``: the page (``static/index.html``), which loads ``static/ui.js`` and ``ui.css``;
- ``/api/state``: :meth:`UiState.snapshot` as JSON; the page polls it every ``refresh_s``;
- ``/vendor/plotly.js``: the plotly.js bundled in the ``plotly`` wheel
  (``plotly.offline.get_plotlyjs()``), so the page needs no network and no build step.

Nothing here reads a store: every request answers from the latest snapshot at once.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from sparkonce.ui.state import UiState

if TYPE_CHECKING:  # pragma: no cover
    from flask import Flask, Response

STATIC = Path(__file__).parent / "static"


def _missing(exc: ImportError) -> ImportError:
    return ImportError(f"sparkonce ui needs Flask and plotly: pip install 'sparkonce[ui]' ({exc})")


def require_ui() -> None:
    """Raise an ImportError naming ``pip install 'sparkonce[ui]'`` unless Flask, werkzeug
    and plotly are installed (the CLI checks before it opens any store)."""
    try:
        import flask  # noqa: F401
        import plotly  # noqa: F401
        import werkzeug  # noqa: F401
    except ImportError as exc:
        raise _missing(exc) from exc


@cache
def plotly_js() -> bytes:
    """The plotly.js bundle of the installed ``plotly`` package (about 4.8 MB), read once."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError as exc:
        raise _missing(exc) from exc
    return get_plotlyjs().encode()


def create_app(state: UiState) -> Flask:
    """The Flask app serving ``state`` (see the module docstring for its routes)."""
    try:
        from flask import Flask, Response, jsonify, send_from_directory
    except ImportError as exc:
        raise _missing(exc) from exc

    app = Flask("sparkonce.ui", static_folder=str(STATIC), static_url_path="/static")

    @app.get("/")
    def index() -> Response:
        response = send_from_directory(STATIC, "index.html")
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.get("/api/state")
    def api_state() -> Response:
        response = jsonify(state.snapshot())
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status=204)

    @app.get("/vendor/plotly.js")
    def vendor_plotly() -> Response:
        return Response(
            plotly_js(),
            mimetype="application/javascript",
            headers={"Cache-Control": "max-age=86400"},
        )

    return app
