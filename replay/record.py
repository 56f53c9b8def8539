"""Record the planner corpus from a real fleet running the demo: one command for what is otherwise
six steps.

    python -m replay.record [--corpus DIR] [--machines 3] [--users 3] [--requests 12]

1. start a `gridctl test start --machines N --netns` fleet in a scratch grid home, holding the
   machine's namespace-fleet lock for the whole recording (one bridge per machine);
2. run `gridctl test demo` on it (the focused coding flow, or with ``--workload-model`` the
   adaptive workday: real requests, real engines) and refuse to record a demo that failed;
3. export the fleet's whole log (`gridctl events export` with the fleet's control home);
4. store it gzip-compressed without a timestamp (`events.ndjson.gz`, byte-stable);
5. regenerate the expected plans from the current planner (`replay.gate.regenerate`) and print
   their summary;
6. stop the fleet and remove its namespaces, whatever happened.

The demo's JSON report is kept beside the corpus as ``demo.json`` (answers' ids, usage and
latencies, every residency transition; no prompt and no response text), so the corpus says what
the fleet went through.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from replay.gate import DEFAULT_CORPUS, EVENTS_FILE, GateError, recorded_agreement, regenerate, rerun_corpus, \
    summary_lines

DEMO_REPORT_FILE = "demo.json"

EXIT_RECORDED = 0
EXIT_FAILED = 1  # the fleet did not start, the demo failed, or the export could not be read

START_TIMEOUT_SECONDS = 600.0
DEMO_TIMEOUT_SECONDS = 1800.0
EXPORT_TIMEOUT_SECONDS = 300.0
STOP_TIMEOUT_SECONDS = 300.0


class RecordError(Exception):
    """A step of the recording failed; the message says which and why."""


def _gridctl(home: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    # The fleet's own home, never the caller's grid: GRID_NATS_URL would point elsewhere.
    env = {k: v for k, v in os.environ.items() if k != "GRID_NATS_URL"} | {"GRID_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "grid.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _step(home: Path, what: str, *args: str, timeout: float) -> str:
    done = _gridctl(home, *args, timeout=timeout)
    if done.returncode != 0:
        raise RecordError(f"{what} failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}")
    return done.stdout


def record(corpus: Path, home: Path, *, machines: int, users: int, requests: int, max_tokens: int,
           capacities_gib: str | None = None, workload_models: Sequence[str] = (),
           say=print) -> list[str]:  # type: ignore[no-untyped-def]
    """Steps 1-6 above; returns the regeneration's summary lines. `workload_models` (W=MODEL)
    make the demo the adaptive workday, which needs `capacities_gib` with two larger hosts."""
    from tests import machine_lock

    corpus.mkdir(parents=True, exist_ok=True)
    with machine_lock.turn(machine_lock.NETNS_FLEET):
        try:
            say(f"starting a {machines}-machine namespace fleet in {home}")
            sizes = ("--capacities-gib", capacities_gib) if capacities_gib else ()
            fleet = json.loads(_step(home, "gridctl test start", "test", "start", "--machines", str(machines),
                                     *sizes, "--netns", "--json", timeout=START_TIMEOUT_SECONDS))
            say("running gridctl test demo")
            started = time.monotonic()
            bindings = [a for b in workload_models for a in ("--workload-model", b)]
            demo = _gridctl(home, "test", "demo", "--users", str(users), "--requests", str(requests),
                            "--max-tokens", str(max_tokens), *bindings, "--json", timeout=DEMO_TIMEOUT_SECONDS)
            try:
                report = json.loads(demo.stdout)
            except ValueError as exc:
                raise RecordError(f"gridctl test demo printed no report (exit {demo.returncode}): "
                                  f"{demo.stderr.strip()[-2000:]}") from exc
            if demo.returncode != 0 or not report.get("passed"):
                failed = [f"{r['name']}: {r['detail']}" for r in report.get("requirements", []) if not r["ok"]]
                raise RecordError("the demo failed, nothing recorded:\n  " + "\n  ".join(failed))
            say(f"demo passed in {time.monotonic() - started:.0f} s")
            (corpus / DEMO_REPORT_FILE).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
            with tempfile.TemporaryDirectory(prefix="grid-record-") as scratch:
                exported = Path(scratch) / "events.ndjson"
                _step(home / "testfleet" / "control", "gridctl events export", "events", "export", "--nats",
                      fleet["nats_url"], "-o", str(exported), timeout=EXPORT_TIMEOUT_SECONDS)
                # mtime=0: the same export compresses to the same bytes.
                (corpus / EVENTS_FILE).write_bytes(gzip.compress(exported.read_bytes(), mtime=0))
        finally:
            stopped = _gridctl(home, "test", "stop", timeout=STOP_TIMEOUT_SECONDS)
            if stopped.returncode != 0:
                say(f"gridctl test stop failed: {(stopped.stderr or stopped.stdout).strip()[-1000:]}")
    rerun = asyncio.run(rerun_corpus(corpus))
    outcome = regenerate(corpus, rerun)
    if not outcome.written:
        raise RecordError(outcome.reason)
    return [*summary_lines(outcome.report)[:-1], f"  {recorded_agreement(rerun)}"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m replay.record",
        description="Record the planner corpus: a namespace test fleet runs `gridctl test demo`, its log is "
                    "exported into the corpus and the expected plans are regenerated (needs root).",
    )
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS,
                        help="Corpus directory to write; default tests/golden/planner_corpus.")
    parser.add_argument("--machines", type=int, default=3, help="Machines of the namespace fleet (default 3).")
    parser.add_argument("--users", type=int, default=3, help="The demo's --users (default 3).")
    parser.add_argument("--requests", type=int, default=12, help="The demo's --requests (default 12).")
    parser.add_argument("--max-tokens", type=int, default=16, help="The demo's --max-tokens (default 16).")
    parser.add_argument("--capacities-gib", default=None,
                        help="The fleet's --capacities-gib (one per machine, e.g. 1,5,5 for the workday).")
    parser.add_argument("--workload-model", action="append", default=[], metavar="W=MODEL",
                        help="The demo's --workload-model, repeatable: record the adaptive workday instead of the "
                             "focused coding flow.")
    parser.add_argument("--home", type=Path, default=None,
                        help="Grid home for the fleet (default a scratch directory removed afterwards).")
    args = parser.parse_args(argv)

    def go(home: Path) -> list[str]:
        return record(args.corpus, home, machines=args.machines, users=args.users, requests=args.requests,
                      max_tokens=args.max_tokens, capacities_gib=args.capacities_gib,
                      workload_models=args.workload_model, say=lambda text: print(text, file=sys.stderr, flush=True))

    try:
        if args.home is not None:
            lines = go(args.home)
        else:
            with tempfile.TemporaryDirectory(prefix="grid-record-home-") as scratch:
                lines = go(Path(scratch))
    except (RecordError, GateError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print("\n".join(lines))
    print(f"recorded {args.corpus / EVENTS_FILE}; commit the corpus with the summary above")
    return EXIT_RECORDED


if __name__ == "__main__":
    sys.exit(main())
