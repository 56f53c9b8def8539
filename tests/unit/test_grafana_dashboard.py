"""deploy/grafana/grid-dashboard.json is a Grafana dashboard whose every query reads metrics Grid exports.

The metric names are taken from the code that defines them (every prometheus_client Counter,
Histogram or Gauge and every GaugeSource or CounterSource under grid/), so a renamed or removed
metric fails here instead of leaving an empty panel. Where promtool (Prometheus's own checker)
is installed, every query is also parsed by it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from grid.metrics import AgentMetrics, ControllerMetrics, GatewayMetrics, exposition, rejected_events

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "grid-dashboard.json"
# Series names a family of each kind exposes (prometheus_client adds _total to counters).
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
DEFINITION = re.compile(r'\b(Counter|Histogram|Gauge|GaugeSource|CounterSource)\(\s*(?:"(grid_\w+)"|([A-Z_]+)\b)')
KINDS = {"Counter": "counter", "CounterSource": "counter", "Histogram": "histogram", "Gauge": "gauge",
         "GaugeSource": "gauge"}
METRIC = re.compile(r"\b(grid_\w+)")
SELECTOR = re.compile(r"\b(grid_\w+)\{([^}]*)\}")
MATCHER = re.compile(r'(\w+)\s*(?:=~|!~|!=|=)\s*"')
GROUPING = re.compile(r"\b(?:by|on)\s*\(([^)]*)\)")
# Labels Prometheus adds at scrape time, and the histogram bucket bound.
TARGET_LABELS = {"instance", "job", "le"}
# Grafana's variables, given values PromQL accepts, for promtool.
GRAFANA_VARS = {"$__rate_interval": "5m", "$model": ".*", "$host": ".*"}


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dash["panels"] if p["type"] != "row"]


def _exprs(dash: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in _panels(dash) for t in p["targets"]]


def exported_series() -> dict[str, str]:
    """Every series name Grid's code exports -> the family it belongs to (from the definitions)."""
    out: dict[str, str] = {}
    for path in sorted((ROOT / "grid").rglob("*.py")):
        text = path.read_text()
        for kind, literal, constant in DEFINITION.findall(text):
            name = literal
            if constant:  # a family named by a module constant, e.g. CounterSource(REJECTED_EVENTS, ...)
                found = re.search(rf'^{constant}\s*=\s*"(grid_\w+)"', text, re.M)
                if found is None:
                    continue
                name = found.group(1)
            family = name.removesuffix("_total") if KINDS[kind] == "counter" else name
            for suffix in SUFFIXES[KINDS[kind]]:
                out[family + suffix] = family
    return out


def _instantiated_labels() -> dict[str, set[str]]:
    """Label names of the families the metrics classes define, by family name."""
    from grid.gateway.host_metrics import host_gauges
    from grid.projections.fleet import FleetState

    labels: dict[str, set[str]] = {}
    for metrics in (GatewayMetrics(), ControllerMetrics(), AgentMetrics()):
        for value in vars(metrics).values():
            if hasattr(value, "_labelnames") and hasattr(value, "_name"):
                labels[value._name] = set(value._labelnames)
    for source in (*host_gauges(FleetState, lambda: 0.0), rejected_events(dict)):
        labels[source.name] = set(source.labels)
    return labels


def test_the_scan_finds_every_family_the_metrics_classes_expose() -> None:
    """The definition scan is complete for what can be built here (so it can be trusted for the rest)."""
    from grid.gateway.host_metrics import host_gauges
    from grid.projections.fleet import FleetState
    from prometheus_client.parser import text_string_to_metric_families

    exported = exported_series()
    registries = [GatewayMetrics([*host_gauges(FleetState, lambda: 0.0), rejected_events(dict)]).registry,
                  ControllerMetrics().registry, AgentMetrics().registry]
    # The parser reports an unlabelled counter's or histogram's creation time as a family of its own.
    families = {f.name for r in registries for f in text_string_to_metric_families(exposition(r).decode())
                if not f.name.endswith("_created")}
    assert families and families <= set(exported.values()), families - set(exported.values())


def test_valid_dashboard_with_a_prometheus_datasource_variable() -> None:
    dash = _dashboard()
    assert dash["title"] and dash["uid"] and isinstance(dash["schemaVersion"], int)
    (ds,) = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert ds["query"] == "prometheus"
    variable = "${" + ds["name"] + "}"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        pos = p["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, p["title"]
    for p in _panels(dash):
        assert p["datasource"] == {"type": "prometheus", "uid": variable}, p["title"]
        assert p["targets"] and p["description"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == variable and t["expr"].strip(), p["title"]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            assert v["datasource"]["uid"] == variable
            assert set(METRIC.findall(v["definition"])) <= set(exported_series()), v


def test_every_query_reads_metrics_the_code_exports() -> None:
    exported = exported_series()
    labels = _instantiated_labels()
    for title, expr in _exprs(_dashboard()):
        names = METRIC.findall(expr)
        assert names, f"{title}: {expr} reads no Grid metric"
        missing = [n for n in names if n not in exported]
        assert not missing, f"{title}: {expr} reads {missing}, which no code under grid/ exports"
        for name, matchers in SELECTOR.findall(expr):
            known = labels.get(exported[name])
            if known is None:
                continue  # a family read from component state (its labels are checked by its own tests)
            unknown = set(MATCHER.findall(matchers)) - known - TARGET_LABELS
            assert not unknown, f"{title}: {expr} matches labels {unknown} that {name} does not have"


def test_the_panels_cover_model_host_fleet_and_control_plane() -> None:
    exprs = [expr for _title, expr in _exprs(_dashboard())]

    def some(metric: str, *words: str) -> bool:
        return any(metric in e and all(w in e for w in words) for e in exprs)

    # Request rate, latency and errors, per model and per serving host.
    for by in ("by (model", "by (host"):
        assert some("grid_gateway_requests_total", by, "rate(")
        assert some("grid_gateway_request_seconds_bucket", by, "histogram_quantile(0.95")
        assert some("grid_gateway_requests_total", by, 'status=~"5')
    assert some("grid_gateway_host_heartbeat_age_seconds", "by (host)")
    assert some("grid_gateway_host_memory_mb", "by (host)")
    assert some("grid_controller_tick_seconds_bucket", "histogram_quantile")
    assert some("grid_controller_plan_age_seconds")
    assert some("grid_events_rejected_total", "by (reason)")


def test_the_gateway_request_series_carry_the_host_label() -> None:
    labels = _instantiated_labels()
    for family in ("grid_gateway_requests", "grid_gateway_request_seconds", "grid_gateway_time_to_first_token_seconds",
                   "grid_gateway_tokens"):
        assert "host" in labels[family] and "model" in labels[family], family


def test_promtool_parses_every_query(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    rules = []
    for i, (_title, expr) in enumerate(_exprs(_dashboard())):
        for var, value in GRAFANA_VARS.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, expr
        rules.append({"record": f"grid:dashboard_query_{i}", "expr": expr})
    path = tmp_path / "rules.json"  # YAML is a superset of JSON: promtool reads it
    path.write_text(json.dumps({"groups": [{"name": "grid-dashboard", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(rules)} rules found" in result.stdout
