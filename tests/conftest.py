"""The suite and ../shared, the project's test data beside the checkout (helpers.SHARED): CI runs
with GWPOLICY_REQUIRE_SHARED=1 and stops at once without it; elsewhere (a user's clone) the modules
that are about that data alone are not collected, the tests that read some of it skip, and the
summary says so."""

from __future__ import annotations

from typing import Any

import pytest

from helpers import REQUIRE_SHARED, SHARED

#: modules whose every test reads ../shared (the translated conformance cases)
ABOUT_SHARED = ["test_gateway_conformance.py", "test_gateway_status.py", "test_gateway_policies_tls.py"]
collect_ignore = [] if SHARED.is_dir() else ABOUT_SHARED


def pytest_sessionstart(session: Any) -> None:
    if REQUIRE_SHARED and not SHARED.is_dir():
        pytest.exit(f"{SHARED} is missing: GWPOLICY_REQUIRE_SHARED (CI) runs the suite with ../shared beside "
                    "the checkout", returncode=1)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not SHARED.is_dir():
        terminalreporter.write_line(f"{SHARED} is not beside this checkout: {', '.join(ABOUT_SHARED)} not collected, "
                                    "and the tests that read it skipped (CI runs them all)")
