"""Logging, configured once per process: pretty on a terminal, JSON lines otherwise.

Every entry point calls ``configure_logging`` first; library code only calls
``structlog.get_logger``. Secrets (tokens, kubeconfig contents) are never passed to a logger.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: str = "info", json: bool | None = None) -> None:
    """Set up structlog and the standard library's logging (Kopf logs through it)."""
    if json is None:
        json = not sys.stderr.isatty()
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=True)
    )
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
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
