"""Logging, configured once per process: pretty on a terminal, JSON lines otherwise.

Every entry point calls ``configure_logging`` first; library code only calls
``structlog.get_logger`` with its component's name (``tessera.operator``, ``tessera.agent``,
``tessera.agent.plugin``, ``tessera.kube.watch``), and every line says which component wrote it
(``logger``), as it says for the standard library's records (Kopf's, aiohttp's). Secrets
(tokens, kubeconfig contents) are never passed to a logger.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict


class NamedPrintLogger(structlog.PrintLogger):
    """structlog's PrintLogger that remembers the name it was asked for (the plain one drops it)."""

    def __init__(self, file: TextIO, name: str) -> None:
        super().__init__(file)
        self.name = name


class NamedPrintLoggerFactory:
    """Makes ``NamedPrintLogger``s: ``structlog.get_logger(name)`` passes the name here."""

    def __init__(self, file: TextIO) -> None:
        self._file = file

    def __call__(self, *args: Any) -> NamedPrintLogger:
        return NamedPrintLogger(self._file, str(args[0]) if args else "tessera")


def add_component(logger: Any, method_name: str, event_dict: EventDict) -> EventDict:
    """Put the logger's name in the line as ``logger`` (a standard library record's name too)."""
    if "logger" not in event_dict:
        record = event_dict.get("_record")
        name = record.name if record is not None else getattr(logger, "name", None)
        if name:
            event_dict["logger"] = name
    return event_dict


def configure_logging(level: str = "info", json: bool | None = None) -> None:
    """Set up structlog and the standard library's logging (Kopf logs through it)."""
    if json is None:
        json = not sys.stderr.isatty()
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        add_component,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=True)
    )
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=NamedPrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(foreign_pre_chain=shared, processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer,
        ])
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
