"""Times a planner on inputs another process wrote: the same-run baseline of the planner benches.

Run as a script with PYTHONPATH set to the source tree whose planner is the baseline (the
script's own directory, not the repository, is what Python puts first on the path, so ``grid``
is that tree's). Reads a JSON list of ``PlannerInput`` from the file named on the command line,
plans each ``--repeat`` times and prints one JSON line per input: the best wall time in seconds
(or process CPU time with ``--clock cpu``) and the sha256 of the plan bytes (the caller
asserts identical plans).

    PYTHONPATH=OTHER_TREE python bench/_plan_timer.py INPUTS.json --repeat 3 [--clock cpu]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time

import msgspec

from grid.fleet.planning import PlannerInput, encode_plan
from grid.planner.plan import plan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inputs")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = ap.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    with open(args.inputs, "rb") as f:
        inputs = msgspec.json.decode(f.read(), type=list[PlannerInput])
    for inp in inputs:
        best = math.inf
        data = b""
        for _ in range(max(1, args.repeat)):
            t0 = clock()
            p = plan(inp)
            best = min(best, clock() - t0)
            data = encode_plan(p)
        print(json.dumps({"seconds": best, "sha256": hashlib.sha256(data).hexdigest()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
