"""External engine registrations: the probe verdict, URL rules, the registry file, and how an
external engine is reported in the heartbeat (managed=False, memory counted once)."""

from __future__ import annotations

import stat
from pathlib import Path

import msgspec
import pytest

from grid.agent import external as ext
from grid.agent.heartbeat import build_heartbeat
from grid.events.host import HostResources

pytestmark = pytest.mark.unit

MODELS = msgspec.json.encode({"object": "list", "data": [{"id": "smol", "object": "model"}]})


def test_classify_passes_a_listed_model_with_a_healthy_engine() -> None:
    result = ext.classify("smol", 200, MODELS, 200)
    assert result.ok and result.models == ("smol",)


@pytest.mark.parametrize(("status", "reason"), [(401, ext.PROBE_KEY_REFUSED), (403, ext.PROBE_KEY_REFUSED),
                                                (500, ext.PROBE_BAD_ANSWER)])
def test_classify_names_a_refused_key_or_a_bad_answer(status: int, reason: str) -> None:
    assert ext.classify("smol", status, b"{}", None).reason == reason


def test_classify_refuses_a_model_the_endpoint_does_not_list_and_says_what_it_lists() -> None:
    result = ext.classify("other", 200, MODELS, None)
    assert result.reason == ext.PROBE_MODEL_NOT_LISTED
    assert "'other'" in result.detail and "smol" in result.detail


def test_classify_reads_ollama_style_model_lists_and_refuses_other_shapes() -> None:
    body = msgspec.json.encode({"models": [{"name": "llama3:8b", "model": "llama3:8b"}]})
    assert ext.classify("llama3:8b", 200, body, None).ok
    assert ext.classify("smol", 200, b"[1, 2]", None).reason == ext.PROBE_BAD_ANSWER
    assert ext.classify("smol", 200, b"not json", None).reason == ext.PROBE_BAD_ANSWER


def test_classify_fails_an_unhealthy_engine_that_still_lists_its_model() -> None:
    assert ext.classify("smol", 200, MODELS, 503).reason == ext.PROBE_UNHEALTHY


@pytest.mark.parametrize(("url", "base"), [
    ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
    ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
    ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080"),
    ("https://api.example.test/openai/v1/", "https://api.example.test/openai"),
])
def test_base_url_drops_a_trailing_v1(url: str, base: str) -> None:
    assert ext.base_url(url) == base


@pytest.mark.parametrize("url", ["ftp://h/x", "not a url", "http://user:secret@h:1", "http://h:1/?key=k"])
def test_base_url_refuses_other_schemes_credentials_and_queries(url: str) -> None:
    refused = ext.base_url(url)
    assert isinstance(refused, ext.RegistrationRefused) and refused.reason == ext.REG_BAD_URL
    assert "secret" not in refused.message  # a credential in the URL is never echoed


def test_validate_refuses_an_unknown_kind_and_negative_memory() -> None:
    assert isinstance(bad := ext.validate("m", "http://h:1", "tgi", 0, None), ext.RegistrationRefused)
    assert bad.reason == ext.REG_BAD_KIND
    assert isinstance(neg := ext.validate("m", "http://h:1", "vllm", -1, None), ext.RegistrationRefused)
    assert neg.reason == ext.REG_BAD_MEMORY


def test_registry_is_owner_only_and_keeps_one_registration_per_model(tmp_path: Path) -> None:
    a = ext.validate("m", "http://127.0.0.1:1", "openai", 10, None)
    b = ext.validate("m", "http://127.0.0.1:2", "llama.cpp", 20, None)
    c = ext.validate("n", "http://127.0.0.1:3", "ollama", 0, None)
    assert isinstance(a, ext.Registration) and isinstance(b, ext.Registration) and isinstance(c, ext.Registration)
    ext.save(tmp_path, ext.with_registration(ext.with_registration(ext.with_registration([], a), c), b))
    assert stat.S_IMODE(ext.registry_path(tmp_path).stat().st_mode) == 0o600
    assert ext.load(tmp_path) == [c, b]
    kept, removed = ext.without(ext.load(tmp_path), "http://127.0.0.1:3/v1")
    assert kept == [b] and removed == [c]


def test_a_damaged_registry_reads_as_empty(tmp_path: Path) -> None:
    ext.registry_path(tmp_path).write_bytes(b"{broken")
    assert ext.load(tmp_path) == []


def test_the_api_key_file_must_be_owner_only(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-test\n")
    key.chmod(0o644)
    reg = ext.validate("m", "http://127.0.0.1:1", "openai", 0, key)
    assert isinstance(reg, ext.Registration)
    assert ext.read_key(reg)[1] is not None and ext.read_key(reg)[1].reason == ext.PROBE_KEY_UNREADABLE
    key.chmod(0o600)
    assert ext.read_key(reg) == ("sk-test", None)


def _engines(tmp_path: Path, ok: bool, now: float, engines: ext.ExternalEngines | None = None) -> ext.ExternalEngines:
    engines = engines or ext.ExternalEngines(tmp_path)
    reg = ext.validate("smol", "http://127.0.0.1:9", "llama.cpp", 300, None)
    assert isinstance(reg, ext.Registration)
    result = ext.ProbeResult(ext.PROBE_OK) if ok else ext.ProbeResult(ext.PROBE_UNREACHABLE, "ConnectError")
    engines.update([(reg, result, "sk-held")], now)
    return engines


def test_a_ready_engine_is_an_unmanaged_residency_with_an_endpoint_and_age(tmp_path: Path) -> None:
    engines = _engines(tmp_path, True, 100.0)
    engines = _engines(tmp_path, True, 104.0, engines)
    (res,), warnings = ext.reports(engines, 110.0)
    assert (res.managed, res.state, res.endpoint, res.memory_mb, res.runtime) == (
        False, "ready", "http://127.0.0.1:9", 300, "llama.cpp")
    assert res.loaded_age_seconds == 10.0 and warnings == ()
    assert engines.ready("smol") is not None and engines.ready("smol").key == "sk-held"
    assert "sk-held" not in repr(engines.engines)


def test_a_dead_engine_is_failed_without_an_endpoint_and_the_warning_says_why(tmp_path: Path) -> None:
    engines = _engines(tmp_path, True, 100.0)
    assert _engines(tmp_path, False, 101.0, engines) is engines
    (res,), (warning,) = ext.reports(engines, 101.0)
    assert (res.state, res.endpoint, res.loaded_age_seconds) == ("failed", None, None)
    assert warning.startswith("external_engine_unreachable: smol at http://127.0.0.1:9")
    assert engines.ready("smol") is None


def test_update_reports_a_change_only_when_the_verdict_or_registration_changes(tmp_path: Path) -> None:
    engines = ext.ExternalEngines(tmp_path)
    reg = ext.validate("smol", "http://127.0.0.1:9", "openai", 0, None)
    assert isinstance(reg, ext.Registration)
    ok = ext.ProbeResult(ext.PROBE_OK)
    assert engines.update([(reg, ok, None)], 1.0)
    assert not engines.update([(reg, ok, None)], 2.0)
    assert engines.update([], 3.0)  # unregistered


def test_heartbeat_counts_external_memory_once(tmp_path: Path) -> None:
    engines = _engines(tmp_path, True, 100.0)
    external, warnings = ext.reports(engines, 100.0)
    hb = build_heartbeat(
        event_id="e", now=100.0, host_id="h1", protection_state="accepting",
        resources=HostResources(capacity_mb=4000), residencies={}, activity={}, managed_rss_mb=0,
        memory_used_mb=1000, cached=(), disk_free_bytes=None, disk_total_bytes=None, cpu_percent=None,
        highest_term=0, warnings=warnings, external=external,
    )
    assert [(r.model_id, r.managed) for r in hb.residencies] == [("smol", False)]
    # 1000 MB used outside Grid, 300 of them declared by the external engine on its residency.
    assert hb.unmanaged_memory_mb == 700
    assert hb.unmanaged_memory_mb + sum(r.memory_mb for r in hb.residencies) == 1000


def test_a_key_file_problem_is_reported_without_its_local_path(tmp_path: Path) -> None:
    key = tmp_path / "private" / "key"
    reg = ext.validate("smol", "http://127.0.0.1:9", "openai", 0, key)
    assert isinstance(reg, ext.Registration)
    _, failure = ext.read_key(reg)
    assert failure is not None and str(key) in failure.detail  # the operator's view, on the host
    engines = ext.ExternalEngines(tmp_path)
    engines.update([(reg, failure, None)], 1.0)
    _, (warning,) = ext.reports(engines, 1.0)
    assert warning.startswith("external_engine_api_key_file_unreadable: smol") and str(tmp_path) not in warning


def test_probe_delay_keeps_the_interval_through_a_restart_then_grows_with_the_outage() -> None:
    assert ext.probe_delay(None, 500.0) == ext.PROBE_INTERVAL_SECONDS  # passing: every round
    # A restart: every interval for the whole recovery window, however many probes failed.
    for down in (0.0, 1.0, 16.0, 31.0, ext.PROBE_RECOVERY_WINDOW_SECONDS):
        assert ext.probe_delay(100.0, 100.0 + down) == ext.PROBE_INTERVAL_SECONDS
    # Then a share of the outage past the window, never below the interval, capped.
    window = ext.PROBE_RECOVERY_WINDOW_SECONDS
    assert ext.probe_delay(0.0, window + 5.0) == ext.PROBE_INTERVAL_SECONDS
    assert ext.probe_delay(0.0, window + 100.0) == pytest.approx(100.0 * ext.PROBE_BACKOFF_SHARE)
    assert ext.probe_delay(0.0, window + 3600.0) == ext.PROBE_BACKOFF_MAX_SECONDS


def _probe_times(engines: ext.ExternalEngines, tmp_path: Path, start: float, until: float) -> list[float]:
    """When a dead engine is probed from `start` to `until`, rounds every interval as the agent runs them."""
    reg = engines.engines["smol"].registration
    probed, now = [], start
    while now < until:
        if engines.due(reg, now):
            _engines(tmp_path, False, now, engines)
            probed.append(now)
        now += ext.PROBE_INTERVAL_SECONDS
    return probed


def test_a_failing_engine_is_probed_every_round_through_a_restart_until_it_passes_or_changes(tmp_path: Path) -> None:
    engines = _engines(tmp_path, True, 0.0)
    reg = engines.engines["smol"].registration
    assert engines.due(reg, 0.5)  # a passing engine is probed every round: its death shows at once
    probed = _probe_times(engines, tmp_path, 1.0, 40.0)
    assert probed == [float(t) for t in range(1, 40)]  # a restart is seen within one round of answering
    assert engines.engines["smol"].failing_since == 1.0
    moved = ext.validate("smol", "http://127.0.0.1:10", "llama.cpp", 300, None)
    assert isinstance(moved, ext.Registration) and engines.due(moved, 40.0)  # re-registered: at once
    _engines(tmp_path, True, 40.0, engines)
    assert engines.engines["smol"].failing_since is None and engines.due(reg, 40.1)


def test_a_long_dead_registration_costs_little(tmp_path: Path) -> None:
    engines = _engines(tmp_path, False, 0.0)
    hour = _probe_times(engines, tmp_path, 1.0, 3600.0)
    gaps = [b - a for a, b in zip(hour, hour[1:])]
    assert max(gaps) <= ext.PROBE_BACKOFF_MAX_SECONDS + ext.PROBE_INTERVAL_SECONDS
    assert gaps[-10:] == [ext.PROBE_BACKOFF_MAX_SECONDS] * 10
    assert len(hour) < 250  # about one a second for the first minute, then two a minute
