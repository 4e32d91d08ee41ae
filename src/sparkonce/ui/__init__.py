"""``sparkonce ui``: a live status page of the pipelines in one or more stores.

:mod:`.state` collects what the page shows as plain dicts (no web code, unit-testable);
:mod:`.app` is the Flask layer that serves it, with the page's own HTML, JS and CSS in
``static/`` (needs the ``ui`` extra: ``pip install 'sparkonce[ui]'``).
"""

from sparkonce.ui.state import StoreWatch, UiState, load_verify_report, pipeline_view

__all__ = ["StoreWatch", "UiState", "load_verify_report", "pipeline_view"]
