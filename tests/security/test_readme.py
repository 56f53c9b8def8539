"""The README's security table is exactly what the permission table renders."""

from __future__ import annotations

from pathlib import Path

from grid.identity.permissions import render_security_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_security_section_shows_the_rendered_table() -> None:
    text = README.read_text()
    section = text.split("## Security\n", 1)[1].split("\n## ", 1)[0]
    table = render_security_table()
    assert table in section
    # ...and no other table (a stale copy) sits beside it.
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert rows == table.splitlines()
