"""--workload-trace: bounded, validated, mapped onto the scenario and mean-normalised."""

from __future__ import annotations

from pathlib import Path

import pytest

from grid.sim import trace
from grid.sim.trace import TraceError


def test_parse_option_rejects_bad_forms() -> None:
    assert trace.parse_option("coding=/tmp/x.csv") == ("coding", Path("/tmp/x.csv"))
    for bad in ("coding", "=x.csv", "coding=", "nonsense=x.csv"):
        with pytest.raises(TraceError):
            trace.parse_option(bad)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0,1\n0,2\n", "strictly increasing"),
        ("0,1\n1,-2\n", "non-negative"),
        ("0,1\n1,nan\n", "finite"),
        ("0,1\n1,inf\n", "finite"),
        ("0,1\nabc,2\n", "numbers"),
        ("0\n1,2\n", "timestamp and a rate"),
        ("0,1\n", "at least two rows"),
    ],
)
def test_bad_rows_are_refused_with_the_line(text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        trace.parse_rows(text)


def test_extra_columns_are_ignored_and_the_mean_follows_the_builtin_curve() -> None:
    rows = trace.parse_rows("0,0,9\n60,10,9\n120,0,9\n180,10,9\n")
    curve = trace.curve(rows, 8, (2.0,) * 8)
    assert len(curve) == 8
    assert abs(sum(curve) / 8 - 2.0) < 1e-6
    assert curve[0] == 0.0 and max(curve) > 2.0  # burst timing comes from the trace


def test_row_and_size_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    many = "".join(f"{i},1\n" for i in range(trace.MAX_TRACE_ROWS + 1))
    with pytest.raises(TraceError, match="more than"):
        trace.parse_rows(many)
    big = tmp_path / "big.csv"
    big.write_bytes(b"0,1\n" * (trace.MAX_TRACE_BYTES // 4 + 1))
    with pytest.raises(TraceError, match="5 MiB"):
        trace.read_trace(big)
    with pytest.raises(TraceError, match="cannot read"):
        trace.read_trace(tmp_path / "missing.csv")
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TraceError, match="UTF-8"):
        trace.read_trace(binary)
