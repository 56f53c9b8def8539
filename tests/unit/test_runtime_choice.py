"""Which llama.cpp runtime the agent spawns (grid.agent.engines.runtime)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from grid.agent.engines import llama_cpp
from grid.agent.engines.runtime import (
    NATIVE,
    XLLAMACPP,
    XLLAMACPP_MODULE,
    RuntimeChoiceError,
    find_runtime,
)


def test_named_choices(tmp_path: Path) -> None:
    x = find_runtime("xllamacpp", environ={})
    assert x is not None and x.name == XLLAMACPP and x.command == (sys.executable, "-m", XLLAMACPP_MODULE)
    assert find_runtime(None, environ={"GRID_RUNTIME_BINARY": "XLLAMACPP"}).name == XLLAMACPP  # type: ignore[union-attr]
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\n")
    os.chmod(fake, 0o755)
    native = find_runtime(str(fake), environ={"GRID_RUNTIME_BINARY": "xllamacpp"})  # explicit wins
    assert native is not None and native.name == NATIVE and native.command == (str(fake.resolve()),)
    assert find_runtime(None, environ={"GRID_LLAMA_SERVER": str(fake)}).command == (str(fake.resolve()),)  # type: ignore[union-attr]
    with pytest.raises(RuntimeChoiceError, match="not an executable"):
        find_runtime(str(tmp_path / "missing"), environ={})
    with pytest.raises(RuntimeChoiceError):
        find_runtime(None, environ={"GRID_RUNTIME_BINARY": str(tmp_path)})  # a directory


def test_default_prefers_the_installed_native_llama_server(native_llama_server: Path) -> None:
    chosen = find_runtime(None, environ={})
    assert chosen is not None and chosen.name == NATIVE and chosen.command == (str(native_llama_server),)


def test_default_without_a_native_llama_server_is_xllamacpp() -> None:
    if llama_cpp.find_llama_server(None, environ={}) is not None:
        pytest.skip("a native llama-server is installed here, and the default prefers it (the test above)")
    chosen = find_runtime(None, environ={})
    assert chosen is not None and chosen.name == XLLAMACPP and chosen.command == (sys.executable, "-m", XLLAMACPP_MODULE)


def test_build_argv_takes_a_runtime_prefix(tmp_path: Path) -> None:
    spec = llama_cpp.EngineSpec(model_id="m", model_path=tmp_path / "m.gguf", port=1234, key_file=tmp_path / "k")
    x = find_runtime("xllamacpp", environ={})
    assert x is not None
    argv = llama_cpp.build_argv(x.command, spec)
    assert argv[:3] == [sys.executable, "-m", XLLAMACPP_MODULE] and argv[3:5] == ["--model", str(spec.model_path)]
    assert llama_cpp.build_argv(Path("/bin/llama-server"), spec)[0] == "/bin/llama-server"
    # every flag build_argv emits is one the xllamacpp entry point accepts
    from grid.agent.engines.xllamacpp_server import parse_args

    with_embeddings = llama_cpp.EngineSpec(model_id="m", model_path=tmp_path / "m.gguf", port=1, key_file=tmp_path / "k",
                                           embeddings=True)
    args = parse_args(llama_cpp.build_argv(x.command, with_embeddings)[3:])
    assert args.embeddings and args.pooling == "mean"
