"""The tiers of the suite: which programs a test starts, read from its module and its fixtures.

A module is in a tier when its code names the program or a helper that starts it (`gateway_proc`
starts the gateway and NGINX, `sandbox_proc` and `live_server` an API server, ...), or when a test
takes a fixture that does (`server_kind`). The fast tier is what is left: the engine, the pure
layers of the gateway, the CLI on files, golden files. `guard` holds the fast tier to that: there,
starting NGINX, kubectl, valgrind or an API server fails the test with the marker its module lacks.

The fast tier is also quick: each property runs on at most `FAST_EXAMPLES` examples there (the full
run on as many as its test asks), and a check marked `slow` (mypy over the package, building the
compiled core) is left to the full run and to `./dev lint`.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path
from typing import Any

MARKERS = {
    "nginx": "starts NGINX (traffic through the data plane, nginx -t)",
    "cluster": "starts the sandbox, a kube-apiserver or one of gwpolicy's processes",
    "kubectl": "runs kubectl",
    "valgrind": "counts instructions under valgrind",
    "slow": "too slow for the fast tier, and checked elsewhere too (mypy: ./dev lint)",
}

#: set by `./dev test --fast`
FAST = os.environ.get("GWPOLICY_TEST_FAST") == "1"

#: the most examples a property runs in the fast tier
FAST_EXAMPLES = 10

#: what in a module's code puts it in a tier
_SIGNS = {
    "nginx": re.compile(r"\b(gateway_proc|mesh_harness|raw_nginx|RawNginx|Served|have_nginx|Nginx\(|backend_hosts|"
                        r"bench\.dataplane|requestpath|nginx_binary)\b|[\"']nginx[\"']|nginx -t"),
    "cluster": re.compile(r"\b(sandbox_proc|live_server|mesh_harness|kube_apiserver|kube_harness|gateway_proc|measure_controller|"
                          r"SandboxProcess|server_kind|module_server_kind|run_sandbox|serve_sandbox)\b|--controller\b|"
                          r"[\"'](controller|gateway|webhook|sandbox)[\"'], *[\"']--"),
    "kubectl": re.compile(r"[\"']kubectl[\"']|\bKUBECTL\b|\bkubectl\(|run_kubectl|\bkubectl_"),
    "valgrind": re.compile(r"valgrind|--instructions"),
}
#: fixtures that start a program
_FIXTURES = {"server_kind": "cluster", "module_server_kind": "cluster"}

#: programs the fast tier must not start, and the marker that says a test does
_PROGRAMS = {"nginx": "nginx", "kubectl": "kubectl", "valgrind": "valgrind", "etcd": "cluster",
             "kube-apiserver": "cluster", "kube-controller-manager": "cluster"}


@functools.cache
def _module_tiers(path: str) -> frozenset[str]:
    code = "\n".join(line for line in Path(path).read_text().splitlines() if not line.lstrip().startswith("#"))
    return frozenset(name for name, sign in _SIGNS.items() if sign.search(code))


def marks(item: Any) -> set[str]:
    """The tier markers of one collected test."""
    found = set(_module_tiers(str(item.path)))
    found.update(tier for fixture, tier in _FIXTURES.items() if fixture in getattr(item, "fixturenames", ()))
    return found


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "subprocess.Popen":
        return
    argv = [str(a) for a in (args[1] or ())] if isinstance(args[1], (list, tuple)) else [str(args[1])]
    words = [os.path.basename(str(args[0] or ""))] + [os.path.basename(a) for a in argv[:2]]
    if any(w.startswith("python") for w in words[:2]) and "gwpolicy" in " ".join(argv[:4]) \
            and any(cmd in argv[:5] for cmd in ("sandbox", "controller", "gateway", "webhook")):
        raise RuntimeError(f"the fast tier starts {' '.join(argv[:5])}: mark the module `cluster` "
                           "(tests/tiers.py)")
    for word in words:
        if word in _PROGRAMS:
            raise RuntimeError(f"the fast tier starts {word}: mark the module `{_PROGRAMS[word]}` (tests/tiers.py)")


def guard() -> None:
    """In the fast tier, refuse to start a program a marker stands for."""
    sys.addaudithook(_audit)


def fewer_examples() -> None:
    """In the fast tier, run each hypothesis property on at most `FAST_EXAMPLES` examples.

    A test's own `@settings(max_examples=N)` outranks any profile, so the cap is applied where such
    settings are attached to a test (also a property defined inside a test); a property without
    its own count takes the `fast` profile's.
    """
    from hypothesis import settings

    settings.register_profile("fast", max_examples=FAST_EXAMPLES)
    settings.load_profile("fast")
    attach = settings.__call__

    def capped(self: settings, test: Any) -> Any:
        if self.max_examples > FAST_EXAMPLES:
            self = settings(self, max_examples=FAST_EXAMPLES)
        return attach(self, test)

    settings.__call__ = capped  # type: ignore[method-assign]
