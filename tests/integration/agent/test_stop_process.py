"""Stopping an engine ends with the child reaped, even while its exit is still in progress.

A multi-threaded engine (llama.cpp's server) can exit its main thread before its other threads
are gone: the kernel then shows the thread-group leader as a zombie while the process still
runs, and `waitpid` cannot reap it yet. Ownership proof rightly calls such a pid "gone" (it will
never serve again), but the agent's stop must still wait for the child itself, or it reports the
engine stopped while the process lives on and then stays a zombie nobody reaps.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from grid.agent.engines import llama_cpp

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pthread_exit of the main thread")

# The main thread leaves at SIGTERM; a second thread keeps the process alive for LINGER seconds.
LINGER_SECONDS = 1.5
_CHILD = f"""
import ctypes, os, signal, sys, threading, time

def linger():
    time.sleep({LINGER_SECONDS})
    os._exit(0)

def on_term(*_):
    threading.Thread(target=linger).start()
    ctypes.CDLL(None).pthread_exit(None)

signal.signal(signal.SIGTERM, on_term)
sys.stdout.write("ready\\n")
sys.stdout.flush()
while True:
    time.sleep(1)
"""


@pytest.fixture
def lingering_child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    yield proc
    proc.kill()
    proc.wait()


def test_stop_waits_for_a_child_whose_main_thread_left_first(lingering_child: subprocess.Popen[bytes]) -> None:
    proof = llama_cpp.capture_proof(lingering_child.pid, port=1)
    started = time.monotonic()
    result = llama_cpp.stop_process(proof, term_timeout=10.0, kill_timeout=5.0, popen=lingering_child)
    assert result == llama_cpp.STOP_STOPPED
    assert lingering_child.returncode == 0  # it finished its own exit: no SIGKILL was needed
    assert time.monotonic() - started >= LINGER_SECONDS * 0.9
    assert not psutil.pid_exists(lingering_child.pid)


def test_the_zombie_leader_state_is_real(lingering_child: subprocess.Popen[bytes]) -> None:
    """The condition above exists: proof says gone while the child cannot be reaped yet."""
    proof = llama_cpp.capture_proof(lingering_child.pid, port=1)
    lingering_child.terminate()
    deadline = time.monotonic() + 5
    while llama_cpp.prove(proof) != llama_cpp.PROOF_GONE:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert lingering_child.poll() is None and psutil.pid_exists(lingering_child.pid)


def test_an_already_exiting_child_is_reaped_too(lingering_child: subprocess.Popen[bytes]) -> None:
    proof = llama_cpp.capture_proof(lingering_child.pid, port=1)
    lingering_child.terminate()
    while llama_cpp.prove(proof) != llama_cpp.PROOF_GONE:
        time.sleep(0.02)
    assert llama_cpp.stop_process(proof, popen=lingering_child) == llama_cpp.STOP_ALREADY_GONE
    assert lingering_child.returncode == 0 and not psutil.pid_exists(lingering_child.pid)


def test_a_child_that_ignores_sigterm_is_killed_and_reaped() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                             "sys.stdout.write('ready\\n'); sys.stdout.flush()\ntime.sleep(60)"],
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        proof = llama_cpp.capture_proof(proc.pid, port=1)
        assert llama_cpp.stop_process(proof, term_timeout=0.3, kill_timeout=5.0, popen=proc) == llama_cpp.STOP_STOPPED
        assert proc.returncode == -9 and not psutil.pid_exists(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_a_proof_taken_as_soon_as_the_child_is_spawned_proves_it() -> None:
    # Popen returns once the child's exec has replaced its memory, sometimes before the new
    # image shows its arguments (an empty /proc command line: read at once, about 1 spawn in 5;
    # by the old proof, which read the executable first, about 1 in 200). A proof taken then
    # never matched the engine again, so its unload was refused as unproven and the engine was
    # left running. 300 spawns (a few seconds) catch the old proof most of the time.
    argv = [sys.executable, "-c", "import time; time.sleep(30)"]
    for _ in range(300):
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        try:
            proof = llama_cpp.capture_proof(proc.pid, port=1)
            assert proof.cmdline == tuple(argv)
            assert llama_cpp.prove(proof) == llama_cpp.PROOF_MATCH
        finally:
            proc.kill()
            proc.wait()
