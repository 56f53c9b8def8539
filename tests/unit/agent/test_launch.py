"""Preparing a host agent's launch without the CLI: refusals are values naming why, and a joined
machine runs as the host its enrolment names."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from grid.agent.launch import (
    ALREADY_RUNNING,
    DEFAULT_YIELD_TO_USER_SECONDS,
    ENROLMENT_DAMAGED,
    ENROLMENT_FILE,
    EXIT_REFUSED,
    HOST_MISMATCH,
    IDENTITY_DIR,
    INVALID_OPTION,
    JOIN_REFUSED,
    NO_GRID,
    Joined,
    Launch,
    LaunchOptions,
    Refused,
    launch,
    parse_port_range,
    prepare,
)
from grid.agent.lock import StateDirLock
from grid.agent.protection import ProtectionPolicy, SensorSample, sensor_target

URL = "nats://127.0.0.1:4222"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GRID_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GRID_NATS_URL", raising=False)
    monkeypatch.delenv("GRID_AGENT_STATE_DIR", raising=False)
    return tmp_path / "home"


def _enrol(home: Path, **fields: object) -> Joined:
    joined = Joined(host_id="joined-host", server="nats://a:4222,nats://b:4222", creds_path=str(home / "h.creds"),
                    **fields)  # type: ignore[arg-type]
    path = home / "agent" / IDENTITY_DIR / ENROLMENT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.encode(joined))
    return joined


@pytest.mark.parametrize(("options", "message"), [
    (LaunchOptions(nats=URL, port_range="38000"), "--port-range must look like 38000-38999, not '38000'"),
    (LaunchOptions(nats=URL, port_range="900-1000"), "--port-range must be within 1024-65535 and low <= high"),
    (LaunchOptions(nats=URL, data_tier="secret"), "--data-tier must be one of"),
    (LaunchOptions(nats=URL, capacity_mb=0), "--memory-mb must be a positive number of MB, not 0"),
    (LaunchOptions(nats=URL, engine_threads=300), "--engine-threads must be 1..256, not 300"),
    (LaunchOptions(nats=URL, orphan_grace=-1), "--orphan-grace must be 0 or more seconds, not -1"),
])
def test_invalid_options_are_refused_before_anything_runs(home: Path, options: LaunchOptions, message: str) -> None:
    refused = prepare(options)
    assert isinstance(refused, Refused) and refused.reason == INVALID_OPTION
    assert refused.message.startswith(message)
    assert not (home / "agent" / "agent.pid").exists()


def test_port_range_parses_its_two_bounds() -> None:
    assert parse_port_range("39000-39010") == (39000, 39010)
    assert isinstance(parse_port_range("39010-39000"), Refused)


def test_without_a_url_the_refusal_says_where_it_looked(home: Path) -> None:
    refused = prepare(LaunchOptions())
    assert isinstance(refused, Refused) and refused.reason == NO_GRID
    assert "gridctl up" in refused.message and str(home / "nats.url") in refused.message


def test_a_plain_launch_carries_the_options_to_the_agent(home: Path) -> None:
    prepared = prepare(LaunchOptions(nats=URL, host_id="h1", tags=("gpu,fast", "eu"), port_range="39000-39010",
                                     engine_threads=1, yield_to_user=30.0, capacity_mb=2048, orphan_grace=5.0))
    assert isinstance(prepared, Launch)
    assert prepared.url == URL and prepared.joined is None
    opts = prepared.agent_options
    assert (opts.host_id, opts.tags, opts.port_range, opts.threads) == ("h1", ("gpu", "fast", "eu"), (39000, 39010), 1)
    assert opts.capacity_mb == 2048 and opts.policy.user_active_seconds == 30.0 and opts.credentials is None
    assert opts.orphan_grace == 5.0
    assert opts.state_dir == home / "agent"
    assert prepared.record.pid > 0 and prepared.record.instance


def test_a_joined_machine_runs_as_its_enrolled_host(home: Path) -> None:
    joined = _enrol(home, failure_domain="rack-7", tags=("edge",))
    prepared = prepare(LaunchOptions())
    assert isinstance(prepared, Launch)
    assert prepared.joined == joined and prepared.url == joined.server
    opts = prepared.agent_options
    assert (opts.host_id, opts.failure_domain, opts.tags) == ("joined-host", "rack-7", ("edge",))
    assert opts.credentials == Path(joined.creds_path)
    # Explicit options still win where the enrolment only suggests.
    explicit = prepare(LaunchOptions(nats=URL, failure_domain="rack-1", tags=("core",)))
    assert isinstance(explicit, Launch)
    assert (explicit.url, explicit.agent_options.failure_domain, explicit.agent_options.tags) == (
        URL, "rack-1", ("core",))


def test_an_employee_machine_yields_to_its_user_by_default(home: Path) -> None:
    _enrol(home)  # joined without --dedicated
    prepared = prepare(LaunchOptions())
    assert isinstance(prepared, Launch)
    assert prepared.agent_options.policy.user_active_seconds == DEFAULT_YIELD_TO_USER_SECONDS
    assert prepared.agent_options.dedicated is False  # reported on heartbeats: an employee machine
    # An explicit figure wins, and 0 turns yielding off.
    explicit = prepare(LaunchOptions(yield_to_user=45.0))
    assert isinstance(explicit, Launch) and explicit.agent_options.policy.user_active_seconds == 45.0
    off = prepare(LaunchOptions(yield_to_user=0.0))
    assert isinstance(off, Launch) and off.agent_options.policy.user_active_seconds is None


def test_a_dedicated_or_unjoined_machine_does_not_yield_unless_asked(home: Path) -> None:
    # A machine that never joined (`node start --nats`) says nothing about a user.
    unjoined = prepare(LaunchOptions(nats=URL))
    assert isinstance(unjoined, Launch) and unjoined.agent_options.policy.user_active_seconds is None
    assert unjoined.agent_options.dedicated is None  # nobody said whose machine it is
    _enrol(home, dedicated=True)  # an always-on server, like the test fleets' hosts
    dedicated = prepare(LaunchOptions())
    assert isinstance(dedicated, Launch) and dedicated.agent_options.policy.user_active_seconds is None
    assert dedicated.agent_options.dedicated is True
    asked = prepare(LaunchOptions(yield_to_user=60.0))
    assert isinstance(asked, Launch) and asked.agent_options.policy.user_active_seconds == 60.0


def test_a_joined_machine_refuses_another_host_id(home: Path) -> None:
    _enrol(home)
    refused = prepare(LaunchOptions(host_id="someone-else"))
    assert refused == Refused(HOST_MISMATCH, "this machine joined as host 'joined-host', not 'someone-else'")


def test_a_damaged_enrolment_is_refused(home: Path) -> None:
    path = home / "agent" / IDENTITY_DIR / ENROLMENT_FILE
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    refused = prepare(LaunchOptions(nats=URL))
    assert isinstance(refused, Refused) and refused.reason == ENROLMENT_DAMAGED
    assert str(path) in refused.message and "join again" in refused.message


def test_an_unreadable_join_token_is_refused(home: Path, tmp_path: Path) -> None:
    refused = prepare(LaunchOptions(nats=URL, join_token_file=tmp_path / "missing.token"))
    assert isinstance(refused, Refused) and refused.reason == JOIN_REFUSED
    assert refused.message.startswith("cannot read the join token:")


def test_a_state_directory_held_by_a_running_agent_is_refused(home: Path) -> None:
    state_dir = home / "agent"
    state_dir.mkdir(parents=True)
    lock = StateDirLock(state_dir)
    lock.acquire()
    try:
        refused = prepare(LaunchOptions(nats=URL))
    finally:
        lock.release()
    assert isinstance(refused, Refused) and refused.reason == ALREADY_RUNNING
    assert "one agent per state directory" in refused.message
    assert isinstance(prepare(LaunchOptions(nats=URL)), Launch)


class Collected:
    def __init__(self) -> None:
        self.errors: list[str] = []
        self.infos: list[str] = []

    def error(self, message: str) -> None:
        self.errors.append(message)

    def info(self, message: str) -> None:
        self.infos.append(message)


def test_a_refused_launch_reports_and_exits_1(home: Path) -> None:
    said = Collected()
    assert launch(LaunchOptions(nats=URL, port_range="x"), said) == EXIT_REFUSED
    assert said.errors == ["--port-range must look like 38000-38999, not 'x'"] and said.infos == []


def test_cpu_throttle_sets_the_policys_cpu_thresholds(home: Path) -> None:
    default = prepare(LaunchOptions(nats=URL))
    assert isinstance(default, Launch)
    assert default.agent_options.policy.cpu_throttle == ProtectionPolicy().cpu_throttle
    at_80 = prepare(LaunchOptions(nats=URL, cpu_throttle=80.0))
    assert isinstance(at_80, Launch) and at_80.agent_options.policy.cpu_throttle == (80.0, 65.0)
    # 0: a fully busy CPU never throttles the host.
    off = prepare(LaunchOptions(nats=URL, cpu_throttle=0.0))
    assert isinstance(off, Launch)
    busy = SensorSample(cpu_percent=100.0)
    assert sensor_target(off.agent_options.policy, busy, "accepting") == ("accepting", "nominal")
    assert sensor_target(at_80.agent_options.policy, busy, "accepting") == ("throttled", "cpu_high")
