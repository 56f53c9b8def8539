"""Replay: extract a window of the log, re-run recorded plans with a chosen planner, diff them.

    from replay import LogSource, FileSource, DuckDBSource, Window, replay_window, write_result

The package sits beside ``grid`` (it reads the log and the analytics store; it never writes
the log) and never imports ``grid.cli``: ``gridctl replay`` (grid/cli/replay.py) and ``gridctl
history`` are its command-line face and call into it.
"""

from replay.diff import Difference, diff_plans
from replay.extract import DuckDBSource, FileSource, LogSource, Source, SourceError, Window, extract_window
from replay.rerun import (
    DEFAULT_PLANNER,
    PlannerPathError,
    PlanOutcome,
    ReplayResult,
    Summary,
    load_planner,
    replay_window,
)
from replay.store import write_result

__all__ = [
    "DEFAULT_PLANNER",
    "Difference",
    "DuckDBSource",
    "FileSource",
    "LogSource",
    "PlanOutcome",
    "PlannerPathError",
    "ReplayResult",
    "Source",
    "SourceError",
    "Summary",
    "Window",
    "diff_plans",
    "extract_window",
    "load_planner",
    "replay_window",
    "write_result",
]
