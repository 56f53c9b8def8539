"""The README's scale-out block, read as the steps an operator follows.

The block is shell, annotated with the machine each part runs on (`# on ctl1`, a line of its
own). Each command line (continuations joined; an inline comment after two spaces dropped) is a
step of one kind:
- `export NAME=VALUE`: the machine's shell keeps it for the commands after it;
- `scp [-r] SRC... MACHINE:DEST`: a file carried to another machine;
- a service (`nats-server`, `gridctl serve ...`, `gridctl node start`): a process left running
  in its own terminal;
- anything else: a command that must succeed.
`<token>` stands for the join token the last `gridctl invite` printed.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

SECTION = "## Scale out"
MACHINE_MARK = re.compile(r"^#\s*on\s+([a-z][a-z0-9-]*)\b")
INLINE_COMMENT = re.compile(r"\s{2,}#.*$")
ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")
TOKEN_PLACEHOLDER = "<token>"

EXPORT, COPY, SERVICE, COMMAND = "export", "copy", "service", "command"


@dataclass(frozen=True)
class Step:
    machine: str
    kind: str
    text: str  # the command as written (continuations joined)
    line: int  # 1-based line in the README, for messages


def _kind(text: str) -> str:
    argv = shlex.split(text)
    if argv[0] == "export":
        return EXPORT
    if argv[0] == "scp":
        return COPY
    while argv and ENV_ASSIGNMENT.match(argv[0]):
        argv = argv[1:]
    if argv[:1] == ["nats-server"] or argv[:2] == ["gridctl", "serve"] or argv[:3] == ["gridctl", "node", "start"]:
        return SERVICE
    return COMMAND


def scale_out_block(readme: Path) -> tuple[list[Step], set[str]]:
    """The steps of the first bash block under "## Scale out", and every machine named."""
    lines = readme.read_text().splitlines()
    start = lines.index(SECTION)
    begin = next(i for i in range(start, len(lines)) if lines[i].strip() == "```bash")
    steps: list[Step] = []
    machine: str | None = None
    pending, pending_line = "", 0
    for i in range(begin + 1, len(lines)):
        raw = lines[i]
        if raw.strip() == "```":
            break
        if not pending:
            mark = MACHINE_MARK.match(raw.strip())
            if mark:
                machine = mark.group(1)
                continue
            if not raw.strip() or raw.lstrip().startswith("#"):
                continue
            pending_line = i + 1
        text = INLINE_COMMENT.sub("", raw).rstrip()
        if text.endswith("\\"):
            pending += text[:-1].rstrip() + " "
            continue
        command = (pending + text.strip()).strip()
        pending = ""
        if machine is None:
            raise ValueError(f"README line {pending_line}: a command before any `# on MACHINE` line")
        steps.append(Step(machine, _kind(command), command, pending_line))
    else:
        raise ValueError(f"the bash block under {SECTION!r} is not closed")
    named = {s.machine for s in steps}
    for s in steps:
        if s.kind == COPY:
            named.add(copy_destination(s.text)[0])
    return steps, named


def export_of(text: str) -> tuple[str, str]:
    name, _, value = shlex.split(text)[1].partition("=")
    return name, value


def copy_destination(text: str) -> tuple[str, str]:
    """(machine, path on it) of an scp step's last argument; the path may be empty (its home)."""
    target = shlex.split(text)[-1]
    machine, sep, path = target.partition(":")
    if not sep:
        raise ValueError(f"scp target {target!r} names no machine")
    return machine, path


def copy_sources(text: str) -> tuple[bool, list[str]]:
    """(recursive, sources) of an scp step."""
    argv = shlex.split(text)[1:-1]
    recursive = "-r" in argv
    return recursive, [a for a in argv if not a.startswith("-")]
