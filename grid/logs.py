"""The one structlog setup every Grid process uses (`gridctl up`, `node start`, `serve ...`).

JSON lines for services and files; a plain console renderer on a terminal. Configured once at
process start; library code only calls ``structlog.get_logger``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal, TextIO

import structlog

LogFormat = Literal["auto", "json", "console"]
LOG_FORMATS: tuple[str, ...] = ("auto", "json", "console")


class _CurrentStderr:
    """Whatever `sys.stderr` is when a line is written, not when logging was configured: a test
    runner (or an embedding program) may swap stderr for a buffer and close it afterwards."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def configure_logging(fmt: LogFormat | str = "auto", *, level: int = logging.INFO, stream: TextIO | None = None) -> None:
    """Route structlog (and stdlib logging) to `stream` (stderr) in the chosen format.

    "auto" renders for people on a terminal and JSON otherwise, so a service under a process
    manager logs machine-readable lines without being told.
    """
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {fmt!r}")
    out: Any = stream or _CurrentStderr()
    as_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    renderer: Any = structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    # Libraries that log through the standard module (uvicorn, nats) go to the same stream.
    logging.basicConfig(level=max(level, logging.WARNING), stream=out, format="%(levelname)s %(name)s: %(message)s", force=True)
