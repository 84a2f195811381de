"""The GRPCRoute conformance cases of tests/data/grpc-conformance as data, and the suite's gRPC
comparisons (`conformance/utils/grpc/grpc.go`) reproduced as that folder's README describes them:
`check_rpc` is one call and its comparison, `eventually` the suite's convergence loop,
`weights_pass` the distribution check.
"""

from __future__ import annotations

import random
import time
from concurrent import futures
from pathlib import Path
from typing import Any, Callable

import grpc
import yaml

from gwpolicy.gateway import grpcecho

CASES_DIR = Path(__file__).resolve().parent / "data" / "grpc-conformance"


def case_names() -> list[str]:
    return sorted(p.stem for p in CASES_DIR.glob("*.yaml"))


def load_case(name: str) -> dict[str, Any]:
    return yaml.safe_load((CASES_DIR / f"{name}.yaml").read_text())


def _code(name: str) -> Any:
    """Go's codes.Code name (`OK`, `Unimplemented`) as grpcio's StatusCode."""
    return grpc.StatusCode.OK if name == "OK" else getattr(grpc.StatusCode, name.upper())


def check_rpc(entry: dict[str, Any], target: str, chan: Any = None) -> tuple[bool, str, grpcecho.Answer | None]:
    """One call of `entry` to `target` (host:port) and compareResponse: (passed, why not, answer)."""
    req = entry["request"]
    own = chan is None
    if own:
        chan = grpcecho.channel(target, authority=req.get("authority"))
    try:
        answer = grpcecho.call(chan, req["method"], [(k.lower(), v) for k, v in (req.get("metadata") or {}).items()],
                               timeout=10)
    finally:
        if own:
            chan.close()
    want = _code(entry["response"]["code"])
    if answer.code != want:
        return False, f"code {answer.code.name}, expected {want.name} ({answer.details})", answer
    if answer.code == grpc.StatusCode.OK:
        if answer.method != grpcecho.method_path(req["method"]):
            return False, f"method {answer.method}", answer
        if entry.get("namespace") and answer.namespace != entry["namespace"]:
            return False, f"namespace {answer.namespace}", answer
        if not answer.pod.startswith(entry.get("backend") or ""):
            return False, f"pod {answer.pod}, expected {entry['backend']}-*", answer
    return True, "", answer


def metadata_problems(entry: dict[str, Any], answer: grpcecho.Answer) -> list[str]:
    """What the echo received against expectedMetadata / absentMetadata (values of a name joined by ',')."""
    got = {k: ",".join(v) for k, v in answer.metadata().items()}
    out = [f"{k}: {got.get(k)!r}, expected {v!r}" for k, v in (entry.get("expectedMetadata") or {}).items()
           if got.get(k.lower()) != v]
    out += [f"{k} present: {got[k]!r}" for k in entry.get("absentMetadata") or [] if k.lower() in got]
    return out


def eventually(check: Callable[[], tuple[bool, str]], *, within: float = 30.0, needed: int = 3) -> str:
    """The suite's AwaitConvergence: '' once `needed` passes in a row happen within `within` seconds,
    else the last reason (100 ms after each failure)."""
    end, streak, why = time.monotonic() + within, 0, "never ran"
    while time.monotonic() < end:
        ok, why = check()
        if ok:
            streak += 1
            if streak >= needed:
                return ""
        else:
            streak = 0
            time.sleep(0.1)
    return why


def weights_pass(w: dict[str, Any], target: str) -> str:
    """One distribution run of a `weights` block: '' when it passes, else why not."""
    def one(_: int) -> str:
        entry = {"request": dict(w["request"]), "response": w["response"], "backend": "", "namespace": ""}
        if random.random() < 0.5:
            entry["request"]["metadata"] = {"x-jitter": str(random.randrange(10000))}
        ok, why, answer = check_rpc(entry, target)  # a new channel per call
        if not ok or answer is None:
            raise AssertionError(why)
        return "-".join(answer.pod.split("-")[:-2])

    with futures.ThreadPoolExecutor(w["concurrency"]) as pool:
        try:
            backends = list(pool.map(one, range(w["totalRequests"])))
        except AssertionError as exc:  # a failed call fails this run; the caller runs it again
            return f"a call failed: {exc}"
    expected = w["expectedWeights"]
    if set(backends) - set(expected):
        return f"unexpected backends {set(backends) - set(expected)}"
    if len(set(backends)) != sum(1 for v in expected.values() if v > 0):
        return f"backends seen: {sorted(set(backends))}"
    for b, share in expected.items():
        got = backends.count(b) / len(backends)
        if abs(got - share) > w["tolerance"]:
            return f"{b}: {got:.3f}, expected {share}"
    return ""
