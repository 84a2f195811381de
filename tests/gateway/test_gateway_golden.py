"""The NGINX configuration rendered for one case per feature and per policy kind, kept as golden files.

Each case is a folder of tests/golden/render/ (`features/NAME`, `policies/KIND`): `input.yaml`, the
objects, and `out/`, the files the data plane renders from them beside the policy kinds the gateway
ships (deploy/4x-*.yaml and deploy/policykinds/, which the gateway reads from the cluster) and the CRDs
of NGINX Gateway Fabric's two settings policies (deploy/crds/gateway.nginx.org/).
`./dev test --update-golden` rewrites `out/`; test_gateway_render.py has NGINX accept every case.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from golden_files import GOLDEN, check_tree
from test_gateway_ngf_policies import ngf_crds
from test_gateway_policies import policy_manifests
from test_gateway_render import load, rendered

CASES = sorted(p.parent for p in (GOLDEN / "render").glob("*/*/input.yaml"))


def case_files(case: Path) -> dict[str, str]:
    """The files the data plane renders for one case."""
    return {rel: data.decode() for rel, data in rendered(policy_manifests() + ngf_crds() + load(case / "input.yaml")).items()}


def test_every_policy_kind_has_a_case() -> None:
    from gwpolicy.gateway import ngfpolicies, policyconf

    cases = {case.name for case in CASES if case.parent.name == "policies"}
    want = {kind.lower() for kind in policyconf.KINDS} | {"backendtlspolicy"} | {f"ngf-{k.lower()}" for k in ngfpolicies.KINDS}
    assert cases == want, f"tests/golden/render/policies/ holds {sorted(cases)}, one per kind: {sorted(want)}"


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.name}" for c in CASES])
def test_rendered_files_are_the_golden_ones(case: Path) -> None:
    check_tree(case / "out", case_files(case))
