"""--planner module:function resolution: clear errors that name the path."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.rerun import PlannerPathError, load_planner


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("no_colon_here", "expected module:function"),
        ("grid.planner.nonexistent_mod:plan", "no module named 'grid.planner.nonexistent_mod'"),
        ("tests.unit.replay.planners:missing", "has no attribute 'missing'"),
        ("tests.unit.replay.planners:NOT_CALLABLE", "is not callable"),
        ("/nonexistent/dir/planner.py:plan", "does not exist"),
    ],
)
def test_bad_planner_paths_name_the_path(path: str, fragment: str) -> None:
    with pytest.raises(PlannerPathError) as info:
        load_planner(path)
    assert path in str(info.value)
    assert fragment in str(info.value)


def test_default_is_the_installed_planner() -> None:
    ref = load_planner()
    assert callable(ref.func)
    assert ref.version


def test_module_and_file_paths(tmp_path: Path) -> None:
    ref = load_planner("tests.unit.replay.planners:without_first_host")
    assert ref.func.__name__ == "without_first_host"
    file = tmp_path / "my_planner.py"
    file.write_text("PLANNER_VERSION = 'mine-1'\ndef plan(pin):\n    raise NotImplementedError\n")
    ref = load_planner(f"{file}:plan")
    assert ref.version == "mine-1"
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_real_module_xyz\n")
    with pytest.raises(PlannerPathError, match="importing .*broken.py failed"):
        load_planner(f"{broken}:plan")
