"""Golden output of every command on the bundled parable (tables and JSON), as gwctl keeps it.

Kept in tests/golden/cli/; `./dev test --update-golden` rewrites them after an intended change, and
`git diff` then shows the change users will see.
"""

from __future__ import annotations

import pytest

from golden_files import GOLDEN, check
from helpers import NOW, ROOT, run_cli

PARABLE = str(ROOT / "examples" / "parable")
CHANGE = str(ROOT / "tests" / "data" / "cake-api-retries-edit.yaml")

CASES = {
    "get-policies-all": ["get", "policies", "-A"],
    "get-policies-wide": ["get", "policies", "-n", "baker", "-o", "wide"],
    "get-policies-name": ["get", "policies", "-n", "payments", "-o", "name"],
    "get-policies-json": ["get", "retrypolicies", "-n", "infra", "-o", "json"],
    "get-policykinds": ["get", "policykinds"],
    "get-policykinds-json": ["get", "policykinds", "-o", "json"],
    "get-httproutes": ["get", "httproutes", "-n", "baker", "-o", "wide"],
    "get-gateways-yaml": ["get", "gtw", "-n", "infra", "-o", "yaml"],
    "describe-route": ["describe", "httproute/cake", "-n", "baker"],
    "describe-service": ["describe", "svc", "cake", "-n", "baker"],
    "describe-gateway": ["describe", "gateways/prod-web", "-n", "infra"],
    "describe-policy": ["describe", "retrypolicy/baker-retries", "-n", "baker"],
    "describe-conflicted-policy": ["describe", "HealthCheckPolicy/cake-health-v2", "-n", "baker"],
    "explain-table": ["explain", "httproute/cake", "maxRetries", "-n", "baker"],
    "explain-section-json": ["explain", "httproute/cake#api", "backoff", "-n", "baker", "-o", "json"],
    "impact-table": ["impact", "timeoutpolicy/https-timeouts", "-n", "infra"],
    "impact-json": ["impact", "retrypolicy/cake-retries", "-n", "baker", "-o", "json"],
    "whatif-delete": ["whatif", "--delete", "healthcheckpolicy/cake-health", "-n", "baker"],
    "whatif-apply-json": ["whatif", "--apply", CHANGE, "-n", "baker", "-o", "json"],
    "graph-dot": ["graph", "-n", "payments"],
    "graph-mermaid": ["graph", "-o", "mermaid", "-n", "payments"],
    "effective-json": ["effective", "-n", "payments"],
    "status-yaml": ["status", "-n", "grocer", "-o", "yaml"],
    # kubectl conventions of `get`
    "get-several-types": ["get", "httproute/cake", "retrypolicy/cake-retries", "svc/cake", "-n", "baker"],
    "get-namespaces-labels": ["get", "namespaces", "--show-labels", "--sort-by", ".metadata.name"],
    "get-httproutes-no-headers": ["get", "httproutes", "-A", "--no-headers", "--sort-by", "{.metadata.creationTimestamp}"],
    "get-policies-custom-columns": ["get", "policies", "-n", "baker", "--sort-by", ".metadata.creationTimestamp", "-o",
                                    "custom-columns=NAME:.metadata.name,KIND:.kind,TARGET:.spec.targetRefs[*].name,"
                                    'ACCEPTED:.status.ancestors[*].conditions[?(@.type=="Accepted")].reason'],
    "get-policies-jsonpath": ["get", "policies", "-A", "-o", "jsonpath={range .items[*]}{.metadata.namespace}/"
                              '{.metadata.name}{"\\t"}{.spec.targetRefs[*].kind}{"\\n"}{end}'],
    "get-empty-json": ["get", "policies", "-n", "nobody-here", "-o", "json"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    run = run_cli(*CASES[name], "-f", PARABLE, "--now", NOW)
    assert run.code == 0, run.err
    assert "Traceback" not in run.err
    got = run.out.replace(str(ROOT), "<root>")
    check(GOLDEN / "cli" / f"{name}.out", got)
