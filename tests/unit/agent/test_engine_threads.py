"""An engine's default thread count leaves one core to everything else on its machine
(grid.agent.engines.llama_cpp.default_threads says what an engine on every core costs)."""

from __future__ import annotations

from pathlib import Path

from grid.agent.engines import llama_cpp
from grid.agent.options import AgentOptions


def test_every_core_but_one_and_never_none() -> None:
    assert [llama_cpp.default_threads(n) for n in (1, 2, 4, 16)] == [1, 1, 3, 15]
    assert llama_cpp.default_threads(0) == 1


def test_the_machine_default_reaches_the_engines_argv(tmp_path: Path) -> None:
    spec = llama_cpp.EngineSpec(model_id="m", model_path=tmp_path / "m.gguf", port=1, key_file=tmp_path / "k")
    argv = llama_cpp.build_argv(Path("llama-server"), spec)
    threads = argv[argv.index("--threads") + 1]
    assert threads == argv[argv.index("--threads-batch") + 1] == str(llama_cpp.default_threads())
    assert AgentOptions().threads == llama_cpp.default_threads()
