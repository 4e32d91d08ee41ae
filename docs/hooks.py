"""mkdocs hook: the reference pages' generated parts, rendered from the code at build time.

A page holds a marker line, ``<!-- generated: NAME -->``, and :func:`on_page_markdown`
replaces it with:

- ``api``: one mkdocstrings block (``::: sparkonce.NAME``) per name in ``sparkonce.__all__``;
- ``cli``: ``sparkonce --help`` and every subcommand's ``--help``, from the parser objects
  of ``sparkonce.cli`` (``build_parser()``), walked recursively;
- ``errors``: every class of ``sparkonce.errors`` with its base, the exit code the CLI gives
  it (the CLI's own mapping, ``sparkonce.cli.common._report``) and its docstring.

The code comes from this checkout's ``src/``, not from whatever is installed. A marker no
generator knows fails the build.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"
MARKER = re.compile(r"^<!-- generated: (\w+) -->$", re.M)
HELP_COLUMNS = "100"


def _use_src() -> None:
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))


@contextlib.contextmanager
def _plain_environment() -> Iterator[None]:
    """No ``SPARKONCE_*`` variables (their values would show as defaults) and a fixed
    width, so the rendered help is the same on every machine."""
    saved = dict(os.environ)
    for name in [n for n in os.environ if n.startswith("SPARKONCE_")]:
        del os.environ[name]
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def api_markdown() -> str:
    _use_src()
    import sparkonce

    return "\n\n".join(f"::: sparkonce.{name}" for name in sorted(sparkonce.__all__)) + "\n"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _walk(parser: argparse.ArgumentParser, words: list[str]) -> Iterator[tuple[str, str]]:
    yield " ".join(words), parser.format_help()
    for name, sub in _subcommands(parser).items():
        yield from _walk(sub, [*words, name])


def cli_markdown() -> str:
    _use_src()
    with _plain_environment():
        from sparkonce.cli import build_parser

        parser = build_parser()
        parser.prog = "sparkonce"
        sections = []
        for command, text in _walk(parser, ["sparkonce"]):
            level = "#" * min(2 + command.count(" "), 4)
            body = text.rstrip().replace("```", "'''")
            sections.append(f"{level} `{command}`\n\n```text\n{body}\n```\n")
    return "\n".join(sections)


def _exit_code(cls: type[BaseException]) -> int:
    """The exit code the CLI gives an error of class ``cls``: its own ``_report``, called on
    an instance made without ``__init__`` (some take keyword-only ids), output discarded."""
    from sparkonce.cli.common import _report

    exc: Any = cls.__new__(cls)
    exc.args = ("(generated)",)
    if "signal_number" in inspect.signature(cls.__init__).parameters:
        exc.signal_number = None
    with contextlib.redirect_stderr(io.StringIO()):
        return _report(exc)


def errors_markdown() -> str:
    _use_src()
    from sparkonce import errors

    classes = [
        c
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, errors.SparkOnceError) and c.__module__ == errors.__name__
    ]
    classes.sort(key=lambda c: (len(c.__mro__), c.__name__))
    rows = ["| error | is a | exit code | what it means, and what to do |", "|---|---|---:|---|"]
    for cls in classes:
        bases = ", ".join(f"`{b.__name__}`" for b in cls.__bases__)
        code = str(_exit_code(cls))
        if issubclass(cls, errors.RunStopped):
            code = "130 (SIGINT), 143 (SIGTERM)"
        doc = " ".join((inspect.getdoc(cls) or "").split()).replace("|", "\\|")
        rows.append(f"| `{cls.__name__}` | {bases} | {code} | {doc} |")
    return "\n".join(rows) + "\n"


GENERATORS: dict[str, Callable[[], str]] = {
    "api": api_markdown,
    "cli": cli_markdown,
    "errors": errors_markdown,
}


def on_page_markdown(markdown: str, **kwargs: object) -> str:
    def replace(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in GENERATORS:
            raise ValueError(f"unknown generated section {name!r}; known: {sorted(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)
