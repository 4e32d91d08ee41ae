"""What the runner, the query building and ``explain`` read of a pipeline.

:class:`~sparkonce.pipeline.Pipeline` hands itself to them (``run()``, ``explain()``);
they name it by this protocol, so none of them imports the module that imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.config import OutputMode, Trigger
    from sparkonce.outputs.output_set import OutputSet
    from sparkonce.sinks.base import Sink
    from sparkonce.sources.base import Source


class PipelineSpec(Protocol):
    """A configured pipeline, read-only: :class:`~sparkonce.pipeline.Pipeline`'s fields."""

    @property
    def name(self) -> str: ...

    @property
    def source(self) -> Source: ...

    @property
    def sink(self) -> Sink: ...

    @property
    def transform(self) -> Callable[[Any], Any]: ...

    @property
    def trigger(self) -> str | Trigger: ...

    @property
    def output_mode(self) -> OutputMode: ...

    @property
    def stateful(self) -> bool | None: ...

    @property
    def output_set(self) -> OutputSet | None: ...

    @property
    def checkpoint_location(self) -> str: ...
