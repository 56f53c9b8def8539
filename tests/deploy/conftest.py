"""tests/deploy runs Grid as operators deploy it: docker-compose.yml under podman (images built,
the stack up) and the README's scale-out section on machines made of network namespaces. Minutes
of a root machine each. The main suite leaves them out (each test is skipped, with the reason);
`.ci/run` runs them as their own step after the main suite, with GRID_DEPLOY_TESTS=1, once
deploy/podman/setup.sh has installed podman and built the base image."""

from __future__ import annotations

import os

import pytest

ENABLE_ENV = "GRID_DEPLOY_TESTS"
SKIP_REASON = (f"deploy test: runs the compose stack under podman or the README's scale-out section in "
               f"network namespaces (root, minutes); set {ENABLE_ENV}=1 to run it (.ci/run does, after the "
               f"main suite, once deploy/podman/setup.sh has installed podman)")


@pytest.fixture(autouse=True)
def _deploy_tests_enabled() -> None:
    if os.environ.get(ENABLE_ENV) != "1":
        pytest.skip(SKIP_REASON)
