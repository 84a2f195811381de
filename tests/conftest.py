"""The server the live tests run against, and ../shared, the project's test data beside the checkout.

Servers: `gwpolicy sandbox` and a real kube-apiserver (tests/kube_apiserver.py). A test or fixture that
takes `server_kind` (or `module_server_kind`, for a module-scoped fixture) runs once per server.
GWPOLICY_TEST_SERVERS picks them (default "sandbox,kube"; ./dev test sets "sandbox" where Go is
missing, having said so once). Where the real server's binaries are missing its runs are skipped with
the reason, and fail under CI, which must run both.

../shared (helpers.SHARED): CI runs with GWPOLICY_REQUIRE_SHARED=1 and stops at once without it;
elsewhere (a user's clone) the modules that are about that data alone are not collected, the tests
that read some of it skip, and the summary says so.

Tiers: each test is marked from what it uses (`tiers.marks`): `nginx` (starts NGINX), `cluster` (the
sandbox, a kube-apiserver or one of our processes), `kubectl` (runs kubectl), `valgrind` (counts
instructions); `slow` is set by hand on a check too slow for the fast tier. `./dev test --fast` runs the
tests with none of them, each property on fewer examples; there a test that starts one of those
programs fails, naming the marker its module lacks."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
#: the helper modules here, and the test modules of every area folder, importable by name from any folder
#: (`from test_gateway_render import nginx_t`): module names are unique across the folders
sys.path[:0] = [str(TESTS)] + sorted(str(d) for d in TESTS.iterdir() if d.is_dir() and any(d.glob("test_*.py")))

import kube_apiserver  # noqa: E402
import tiers  # noqa: E402
from helpers import REQUIRE_SHARED, SHARED  # noqa: E402
from live_server import require  # noqa: E402

SERVERS = [s.strip() for s in os.environ.get("GWPOLICY_TEST_SERVERS", "sandbox,kube").split(",") if s.strip()]

#: modules whose every test reads ../shared (the translated conformance cases)
ABOUT_SHARED = ["test_gateway_conformance.py", "test_gateway_status.py", "test_gateway_policies_tls.py"]
collect_ignore_glob = [] if SHARED.is_dir() else [f"**/{name}" for name in ABOUT_SHARED]


@pytest.fixture(params=SERVERS)
def server_kind(request: pytest.FixtureRequest) -> str:
    return require(request.param)


@pytest.fixture(scope="module", params=SERVERS)
def module_server_kind(request: pytest.FixtureRequest) -> str:
    return require(request.param)


def pytest_configure(config: pytest.Config) -> None:
    for name, what in tiers.MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    if tiers.FAST:
        tiers.guard()
        tiers.fewer_examples()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for name in tiers.marks(item):
            item.add_marker(name)


def pytest_sessionstart() -> None:
    if REQUIRE_SHARED and not SHARED.is_dir():
        pytest.exit(f"{SHARED} is missing: GWPOLICY_REQUIRE_SHARED (CI) runs the suite with ../shared beside "
                    "the checkout", returncode=1)


def pytest_sessionfinish() -> None:
    kube_apiserver.shutdown()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    if kube_apiserver.TIMINGS:
        terminalreporter.write_sep("-", "real control plane")
        kube_apiserver.print_timings(terminalreporter.write_line)
    if not SHARED.is_dir():
        terminalreporter.write_line(f"{SHARED} is not beside this checkout: {', '.join(ABOUT_SHARED)} not collected, "
                                    "and the tests that read it skipped (CI runs them all)")
