"""Fault injection for tests: failures and latency on chosen requests (docs/controller.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gwpolicy.sandbox.objects import ApiFailure


@dataclass
class FaultRule:
    """Fail the `nth` matching request from now (or every one, `times` times; -1: for good) with `code`.
    A rule may be for one client only: by User-Agent (a substring) or by fieldManager (exact)."""

    code: int
    nth: int = 1
    times: int = 1
    verb: str | None = None  # "write" (create/update/patch/delete), "list", "get", "watch"; None: writes
    resource: str | None = None  # plural, e.g. "httproutes"
    user_agent: str | None = None
    field_manager: str | None = None
    seen: int = 0

    def matches(self, verb: str, resource: str, client: tuple[str, str]) -> bool:
        return ((self.verb or "write") == verb and (self.resource is None or self.resource == resource)
                and (self.user_agent is None or self.user_agent in client[0])
                and (self.field_manager is None or self.field_manager == client[1]))


@dataclass
class Faults:
    """Fault injection for tests (POST /sandbox/faults; docs/controller.md)."""

    rules: list[FaultRule] = field(default_factory=list)
    latency: float = 0.0
    client: tuple[str, str] = ("", "")  # the request in hand: (User-Agent, fieldManager)

    def check(self, verb: str, resource: str) -> None:
        due = None
        for rule in self.rules:  # every rule counts the request, so `nth` is from when it was set
            if rule.matches(verb, resource, self.client):
                rule.seen += 1
                if due is None and rule.seen >= rule.nth:
                    due = rule
        if due is not None:
            rule = due
            if rule.times > 0:
                rule.times -= 1
                if rule.times == 0:
                    self.rules.remove(rule)
            if rule.code == 409:
                raise ApiFailure(409, "Conflict", "Operation cannot be fulfilled: the object has been modified; "
                                 "please apply your changes to the latest version and try again (injected)")
            raise ApiFailure(rule.code, "InternalError", f"Internal error occurred: injected failure ({rule.code})")
