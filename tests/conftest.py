"""The server the live tests run against: `gwpolicy sandbox` and a real kube-apiserver
(tests/kube_apiserver.py). A test or fixture that takes `server_kind` (or `module_server_kind`, for a
module-scoped fixture) runs once per server. GWPOLICY_TEST_SERVERS picks them (default
"sandbox,kube"; ./dev test sets "sandbox" where Go is missing, having said so once). Where the real
server's binaries are missing its runs are skipped with the reason, and fail under CI, which must run
both."""

from __future__ import annotations

import os

import pytest

import kube_apiserver
from live_server import require

SERVERS = [s.strip() for s in os.environ.get("GWPOLICY_TEST_SERVERS", "sandbox,kube").split(",") if s.strip()]


@pytest.fixture(params=SERVERS)
def server_kind(request: pytest.FixtureRequest) -> str:
    return require(request.param)


@pytest.fixture(scope="module", params=SERVERS)
def module_server_kind(request: pytest.FixtureRequest) -> str:
    return require(request.param)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    kube_apiserver.shutdown()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config) -> None:  # noqa: ANN001 - pytest's hook
    if kube_apiserver.TIMINGS:
        terminalreporter.write_sep("-", "real control plane")
        kube_apiserver.print_timings(terminalreporter.write_line)
