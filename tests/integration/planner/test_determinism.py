"""Same input bytes give the same plan bytes, across processes and hash seeds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = r"""
import hashlib, sys
sys.path.insert(0, "bench")
from planner_scale import make_input, saturated_input, steady_input
from grid.fleet.planning import encode_plan
from grid.planner.plan import plan
inp = make_input(64, 48, 11)
first = plan(inp)
out = [encode_plan(first), encode_plan(plan(steady_input(inp, first, 11))), encode_plan(plan(saturated_input(24, 12)))]
print(hashlib.sha256(b"".join(out)).hexdigest())
"""


def _digest(seed: str) -> str:
    env = dict(os.environ, PYTHONHASHSEED=seed)
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_plan_bytes_do_not_depend_on_hash_seed_or_process():
    assert _digest("1") == _digest("2") == _digest("12345")
