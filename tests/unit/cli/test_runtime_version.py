"""Hosts report their engine runtime's real version, and `gridctl status` shows it."""

from __future__ import annotations

from importlib.metadata import version

from grid.agent import inventory as inv
from grid.agent.engines.runtime import parse_native_version, runtime_version, xllamacpp_runtime
from grid.events.host import HostResources, RuntimeBuild
from grid.fleet.hardware import hardware_row
from tests.unit.cli.statusdoc import host_row, rendered, status_doc

# `llama-server --version` as llama.cpp prints it (on stderr).
NATIVE_VERSION_TEXT = "version: 4589 (eb7cf15a)\nbuilt with cc (Debian 12.2.0-14) 12.2.0 for x86_64-linux-gnu\n"


def test_native_version_is_parsed_from_llama_servers_output():
    assert parse_native_version(NATIVE_VERSION_TEXT) == "b4589 (eb7cf15a)"
    assert parse_native_version("error: unknown argument --version") == ""
    assert parse_native_version(None) == ""


def test_probe_names_the_version_of_either_runtime():
    answers = {"llama-server": NATIVE_VERSION_TEXT}

    def recorded(argv):
        return answers.get(argv[0]) if argv[-1] == "--version" else None

    native = inv.probe_runtime_build(("/opt/llama/llama-server",), run=lambda a: None,
                                     run_text=lambda a: recorded(("llama-server", *a[1:])))
    assert native == RuntimeBuild(runtime="llama.cpp", backends=("cpu",), version="b4589 (eb7cf15a)")
    # The xllamacpp module answers no --version: the wheel's version is the runtime's.
    assert runtime_version(xllamacpp_runtime().command, lambda a: None) == f"xllamacpp {version('xllamacpp')}"
    assert runtime_version(None, recorded) == ""


def test_status_shows_the_runtime_version(monkeypatch):
    res = HostResources(capacity_mb=8000, runtime_builds=(RuntimeBuild(runtime="llama.cpp", backends=("cpu",),
                                                                      version="xllamacpp 2026.10.11549"),))
    doc = status_doc([host_row(hardware=hardware_row(res, None, None))])
    out, _ = rendered(doc, monkeypatch)
    line = next(ln for ln in out.splitlines() if "llama.cpp(cpu)" in ln)
    assert "llama.cpp(cpu) xllamacpp 2026.10.11549" in line
