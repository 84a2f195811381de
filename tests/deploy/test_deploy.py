"""`kubectl apply -k deploy/` installs gwpolicy into a cluster: the Gateway API and gwpolicy CRDs, and
the controller, the webhook and the gateway, each with its own ServiceAccount and ClusterRole; its
server-side dry run passes against the sandbox (as against kube-apiserver: once the namespace
exists); and each process's role grants what its code reads and writes, no less."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

import kube_apiserver
from gwpolicy.gateway import controller as gateway
from gwpolicy.gateway import policyconf, sidecar
from gwpolicy.gateway.facts import ROUTE_KINDS as GATEWAY_ROUTE_KINDS
from gwpolicy.kube import client as kube
from gwpolicy.kube import defaults
from gwpolicy.mesh import proxy as mesh
from gwpolicy.sandbox import bundled
from helpers import ROOT
from kube_apiserver import KubeApiServer
from live_server import require
from sandbox_proc import SandboxProcess

DEPLOY = ROOT / "deploy"
PROCESSES = ("controller", "webhook", "gateway")
MESH_CRD = "gateway-api/experimental/gateway.networking.x-k8s.io_xmeshes.yaml"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def _listed() -> list[str]:
    return _docs(DEPLOY / "kustomization.yaml")[0]["resources"]


def test_the_kustomization_lists_every_file_of_deploy_in_order() -> None:
    listed = _listed()
    top = sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
    crds = sorted(f"gateway-api/standard/{p.name}" for p in (DEPLOY / "gateway-api" / "standard").glob("*.yaml")
                  if "_vap_" not in p.name)  # the bundle's admission policy refuses its own dev version (kustomization.yaml)
    crds.append(MESH_CRD)  # the experimental channel's XMesh, which the mesh reads
    assert sorted(listed) == sorted(top + crds)
    assert listed == ["00-namespace.yaml", *crds, *top[1:]], "in order: the namespace, the Gateway API CRDs, then by number"
    kinds = _docs(DEPLOY / "policykinds" / "kustomization.yaml")[0]["resources"]
    assert kinds == sorted(p.name for p in (DEPLOY / "policykinds").glob("*.yaml") if p.name != "kustomization.yaml")
    mesh = _docs(DEPLOY / "mesh" / "kustomization.yaml")[0]["resources"]
    assert sorted(mesh) == sorted(p.name for p in (DEPLOY / "mesh").glob("*.yaml") if p.name != "kustomization.yaml")


@pytest.fixture(params=["none", "standard"])
def sandbox(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SandboxProcess]:
    """A cluster without any CRD (as a new one), and the sandbox as it starts (with ours)."""
    with SandboxProcess(tmp_path, "--crds", request.param) as sb:
        yield sb


def test_kubectl_apply_k_deploy_dry_run_then_install(sandbox: SandboxProcess) -> None:
    sb = sandbox
    # a server dry run cannot create objects in a namespace it only pretends to create (kube-apiserver's
    # NamespaceLifecycle refuses them alike): the namespace first
    sb.kubectl("apply", "-f", str(DEPLOY / "00-namespace.yaml"))
    for extra in ([], ["--server-side"]):
        dry = sb.kubectl("apply", "-k", str(DEPLOY), "--dry-run=server", *extra)
        assert "deployment.apps/gwpolicy-gateway" in dry.stdout and "(server dry run)" in dry.stdout
    assert sb.kubectl("get", "deployments", "-n", "gwpolicy-system", "-o", "name").stdout == ""  # nothing stored
    sb.kubectl("apply", "-k", str(DEPLOY))
    sb.kubectl("wait", "--for=condition=Established", "crd/policykinds.gwpolicy.io", "--timeout=30s")
    sb.kubectl("apply", "-k", str(DEPLOY / "policykinds"))
    sb.kubectl("wait", "--for=condition=Established", "crd/xmeshes.gateway.networking.x-k8s.io", "--timeout=30s")
    sb.kubectl("apply", "-k", str(DEPLOY / "mesh"))
    assert set(sb.kubectl("get", "deployments,serviceaccounts", "-n", "gwpolicy-system", "-o", "name").stdout.split()) >= {
        *(f"deployment.apps/gwpolicy-{p}" for p in PROCESSES), *(f"serviceaccount/gwpolicy-{p}" for p in PROCESSES),
        "deployment.apps/gwpolicy-mesh-default", "serviceaccount/gwpolicy-mesh"}
    assert sb.kubectl("get", "xmeshes", "-o", "name").stdout.split() == ["xmesh.gateway.networking.x-k8s.io/gwpolicy"]
    for p in (*PROCESSES, "mesh"):  # one ServiceAccount and one ClusterRole per process, bound together
        binding = json.loads(sb.kubectl("get", "clusterrolebinding", f"gwpolicy-{p}", "-o", "json").stdout)
        assert binding["roleRef"]["name"] == f"gwpolicy-{p}"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"gwpolicy-{p}", "namespace": "gwpolicy-system"}]
    assert len(sb.kubectl("get", "policykinds", "-o", "name").stdout.split()) == 5
    assert "crd/httproutes.gateway.networking.k8s.io" in sb.kubectl("get", "crd", "-o", "name").stdout.replace(
        "customresourcedefinition.apiextensions.k8s.io", "crd")
    # applied again (an upgrade), the dry runs pass too: server-side apply over what kubectl's
    # client-side apply wrote takes lists applied without their defaults (a webhook's selectors,
    # a Service port's protocol) as the same, as kube-apiserver does
    for extra in ([], ["--server-side"]):
        assert sb.kubectl("apply", "-k", str(DEPLOY), "--dry-run=server", *extra).returncode == 0


def test_kubectl_apply_k_deploy_on_a_real_api_server(tmp_path: Path) -> None:
    """The same install on an empty kube-apiserver: the server dry run passes (once the namespace
    exists), the install creates every process's Deployment and ServiceAccount, and an upgrade's dry
    run passes too."""
    require("kube")
    with KubeApiServer(kube_apiserver.cluster_folder()) as server:
        server.kubectl("apply", "-f", str(DEPLOY / "00-namespace.yaml"))
        for extra in ([], ["--server-side"]):
            dry = server.kubectl("apply", "-k", str(DEPLOY), "--dry-run=server", *extra)
            assert "deployment.apps/gwpolicy-gateway" in dry.stdout and "(server dry run)" in dry.stdout
        assert server.kubectl("get", "deployments", "-n", "gwpolicy-system", "-o", "name").stdout == ""
        server.kubectl("apply", "-k", str(DEPLOY))
        server.kubectl("wait", "--for=condition=Established", "crd/policykinds.gwpolicy.io", "--timeout=30s")
        server.kubectl("apply", "-k", str(DEPLOY / "policykinds"))
        server.kubectl("wait", "--for=condition=Established", "crd/xmeshes.gateway.networking.x-k8s.io", "--timeout=30s")
        server.kubectl("apply", "-k", str(DEPLOY / "mesh"))
        names = set(server.kubectl("get", "deployments,serviceaccounts", "-n", "gwpolicy-system", "-o", "name").stdout.split())
        assert names >= {*(f"deployment.apps/gwpolicy-{p}" for p in PROCESSES),
                         *(f"serviceaccount/gwpolicy-{p}" for p in PROCESSES),
                         "deployment.apps/gwpolicy-mesh-default", "serviceaccount/gwpolicy-mesh"}
        assert len(server.kubectl("get", "policykinds", "-o", "name").stdout.split()) == 5
        for extra in ([], ["--server-side"]):
            assert server.kubectl("apply", "-k", str(DEPLOY), "--dry-run=server", *extra).returncode == 0


# ---------------------------------------------------------------------------------------------
# RBAC: what each process's ClusterRole (with its aggregated roles) and Lease Role grant


def _manifests() -> list[dict[str, Any]]:
    return [d for f in _listed() for d in _docs(DEPLOY / f)]


def _cluster_rules(sa: str) -> list[dict[str, Any]]:
    docs = _manifests()
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    bindings = [d for d in docs if d["kind"] == "ClusterRoleBinding"
                and any(s.get("name") == sa for s in d.get("subjects") or [])]
    assert len(bindings) == 1, f"{sa}: one ClusterRoleBinding"
    role = roles[bindings[0]["roleRef"]["name"]]
    rules = list(role.get("rules") or [])
    for sel in (role.get("aggregationRule") or {}).get("clusterRoleSelectors") or []:
        want = sel.get("matchLabels") or {}
        for other in roles.values():
            labels = (other.get("metadata") or {}).get("labels") or {}
            if other is not role and all(labels.get(k) == v for k, v in want.items()):
                rules += other.get("rules") or []
    return rules


def _allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(group in r.get("apiGroups", []) and (resource in r.get("resources", []) or "*" in r.get("resources", [])
                                                    or ("/" in resource and "*/" + resource.split("/")[1] in r.get("resources", [])))
               and (verb in r.get("verbs", []) or "*" in r.get("verbs", [])) for r in rules)


def _watched(builtin: list[kube.Kind], reads_mesh: bool) -> list[kube.Kind]:
    """What a process's informers list and watch: its built-in kinds, CRDs, and the kinds of the CRDs
    `kubectl apply -k deploy/` installs that `kube.kind_of_crd` picks (as the process does at run time),
    with the XMesh when it reads the mesh (kube/process.py `reads_mesh`)."""
    crds = [o for o in bundled.objects("standard") if o["kind"] == "CustomResourceDefinition"]
    policykinds = {(o["spec"]["group"], o["spec"]["kind"]) for o in bundled.objects("standard") if o["kind"] == "PolicyKind"}
    found = [k for k in (kube.kind_of_crd(c, policykinds) for c in crds) if k is not None]
    assert {k.kind for k in found} >= {"Gateway", "HTTPRoute", "TimeoutPolicy", "PolicyKind"}
    if reads_mesh:
        found += _mesh_kinds()
    return [kube.CRD, *builtin, *found]


def _mesh_kinds() -> list[kube.Kind]:
    """The kinds that turn the mesh on, as a process that reads the mesh finds them once their CRDs
    are installed: the XMesh of deploy/'s experimental CRD, and the standard channel's Mesh, whose
    CRD the Gateway API does not ship yet (made here as its names will be)."""
    from gwpolicy.engine.mesh import MESH_KINDS

    crds = _docs(DEPLOY / MESH_CRD) + [
        {"spec": {"group": g, "names": {"kind": k, "plural": k.lower() + "es"}, "scope": "Cluster",
                  "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}}}]}}
        for g, k in MESH_KINDS if k != "XMesh"]
    found = [k for k in map(kube.mesh_kind_of_crd, crds) if k is not None]
    assert {(k.group, k.kind) for k in found} == set(MESH_KINDS)
    return found


@pytest.mark.parametrize("process", PROCESSES)
def test_each_process_may_read_what_it_watches(process: str) -> None:
    from gwpolicy.controller.app import Controller
    from gwpolicy.webhook.server import WebhookProcess

    rules = _cluster_rules(f"gwpolicy-{process}")
    builtin = gateway.BUILTIN if process == "gateway" else kube.BUILTIN
    shell = {"controller": Controller, "webhook": WebhookProcess, "gateway": gateway.GatewayController}[process]
    missing = [f"{k.plural}.{k.group} {verb}" for k in _watched(builtin, shell.reads_mesh)
               for verb in ("get", "list", "watch") if not _allows(rules, k.group, k.plural, verb)]
    assert not missing, f"gwpolicy-{process} cannot {missing}"


def test_the_gateway_may_write_what_it_writes() -> None:
    rules = _cluster_rules("gwpolicy-gateway")
    gw = "gateway.networking.k8s.io"
    statuses = [(gw, p) for p in ("gatewayclasses", "gateways", "backendtlspolicies")]
    statuses += [(gw, k.lower() + "s") for k in GATEWAY_ROUTE_KINDS]
    statuses += [(policyconf.GROUP, k.lower()[:-1] + "ies") for k in policyconf.KINDS]  # ...Policy -> ...policies
    missing = [f"{res}/status.{g}" for g, res in statuses if not _allows(rules, g, f"{res}/status", "patch")]
    assert not missing, missing
    assert _allows(rules, gw, "gatewayclasses", "patch")  # the supported-policy-kinds annotation
    assert not _allows(rules, gw, "httproutes", "patch") and not _allows(rules, "", "secrets", "patch")  # no more


def _mesh_watched() -> list[kube.Kind]:
    """What the mesh's informers list and watch: its built-in kinds, CRDs, and the kinds of the CRDs
    deploy/ installs that it reads (mesh/proxy.py WATCHED_CRD_KINDS), as it finds them at run time."""
    crds = [o for o in bundled.objects("standard") if o["kind"] == "CustomResourceDefinition"] + _docs(DEPLOY / MESH_CRD)
    found = [k for k in (kube.served_kind(c) for c in crds) if k is not None and (k.group, k.kind) in mesh.WATCHED_CRD_KINDS]
    assert {k.kind for k in found} >= {"HTTPRoute", "XMesh", "TimeoutPolicy"}
    return [kube.CRD, *mesh.BUILTIN, *found, *_mesh_kinds()]


def test_the_mesh_may_read_what_it_watches_and_write_only_route_and_xmesh_status() -> None:
    rules = _cluster_rules("gwpolicy-mesh")
    missing = [f"{k.plural}.{k.group} {verb}" for k in _mesh_watched() for verb in ("list", "watch")
               if not _allows(rules, k.group, k.plural, verb)]
    assert not missing, f"gwpolicy-mesh cannot {missing}"
    gw, x = "gateway.networking.k8s.io", "gateway.networking.x-k8s.io"
    assert _allows(rules, gw, "httproutes/status", "patch") and _allows(rules, x, "xmeshes/status", "patch")
    assert _allows(rules, gw, "httproutes", "get") and _allows(rules, x, "xmeshes", "get")  # read again after a 409
    writes = [(r["apiGroups"], r["resources"], v) for r in rules for v in r["verbs"] if v not in ("get", "list", "watch")]
    assert _allows(rules, gw, "meshes/status", "patch")
    assert writes == [([gw], ["httproutes/status"], "patch"), ([x], ["xmeshes/status"], "patch"),
                      ([gw], ["meshes/status"], "patch")]


def test_the_mesh_proxy_deployment_runs_as_the_mesh_and_shares_its_lease() -> None:
    """deploy/mesh/: the XMesh of the mesh controller, and a proxy per client namespace (that of
    `default`) as gwpolicy-mesh, in the namespace of its Lease Role, ready on /readyz at the port
    it listens on, NET_ADMIN only in the init container that makes the Service range local."""
    from gwpolicy.engine.mesh import MESH_CONTROLLER

    xmesh = _docs(DEPLOY / "mesh" / "xmesh.yaml")[0]
    assert (xmesh["kind"], xmesh["spec"]["controllerName"]) == ("XMesh", MESH_CONTROLLER)
    deployment = _docs(DEPLOY / "mesh" / "proxy-default.yaml")[0]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gwpolicy-mesh"
    role = next(d for d in _docs(DEPLOY / "80-mesh.yaml") if d["kind"] == "Role")
    assert deployment["metadata"]["namespace"] == role["metadata"]["namespace"]
    container = next(c for c in pod["containers"] if c["name"] == "mesh")
    assert container["args"][0] == "mesh"
    opts = mesh.parse(container["args"][1:])
    assert opts.namespace == "default" and opts.leader_election and opts.lease_namespace is None
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}} \
        in container["env"]  # the Lease's namespace: the pod's (kube/defaults.py)
    probe = container["readinessProbe"]["httpGet"]
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == probe["port"])
    assert probe["path"] == "/readyz" and port == defaults.PORTS["mesh"]
    assert "NET_ADMIN" not in str(container["securityContext"])
    init = pod["initContainers"][0]
    assert init["securityContext"]["capabilities"]["add"] == ["NET_ADMIN"] and init["command"][:4] == ["ip", "route", "replace", "local"]


def test_the_controller_may_write_status_of_every_kind_it_analyses() -> None:
    rules = _cluster_rules("gwpolicy-controller")
    skip = {"CustomResourceDefinition", "PolicyKind", "Namespace", "Service", "ReferenceGrant"}
    from gwpolicy.controller.app import Controller

    watched = _watched(kube.BUILTIN, Controller.reads_mesh)
    assert "XMesh" in {k.kind for k in watched}  # its gwpolicy.io/<Kind>Affected condition, as a Gateway's
    missing = [f"{k.plural}/status.{k.group}" for k in watched
               if k.kind not in skip and k.status_subresource and not _allows(rules, k.group, f"{k.plural}/status", "patch")]
    assert not missing, missing
    assert _allows(rules, "", "services", "patch") and _allows(rules, "", "namespaces", "patch")  # the annotation


@pytest.mark.parametrize("process, lease", [("controller", True), ("gateway", True), ("webhook", False), ("mesh", True)])
def test_the_lease_role_is_the_process_own(process: str, lease: bool) -> None:
    docs = _manifests()
    sa = f"gwpolicy-{process}"
    bound = {d["roleRef"]["name"] for d in docs if d["kind"] == "RoleBinding"
             and any(s.get("name") == sa for s in d.get("subjects") or [])}
    rules = [r for d in docs if d["kind"] == "Role" and d["metadata"]["name"] in bound for r in d.get("rules") or []]
    assert all(_allows(rules, "coordination.k8s.io", "leases", v) for v in ("get", "create", "update")) == lease


def test_the_gateway_pod_runs_nginx_in_a_container_of_its_own() -> None:
    """A crash of the gateway's container leaves NGINX serving: NGINX is run by `gwpolicy
    nginx-sidecar` in the pod's nginx container, on the state directory both containers mount at
    the same path, in a pod whose containers see (and, as one user, signal) each other's processes;
    the gateway adopts and reloads it. Several replicas, each ready on /readyz, and a disruption
    budget that lets one go at a time."""
    deployment = next(d for d in _docs(DEPLOY / "70-gateway.yaml") if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod.get("shareProcessNamespace") is True
    containers = {c["name"]: c for c in pod["containers"]}
    gw, ng = containers["gateway"], containers["nginx"]
    assert gw["args"][0] == "gateway" and ng["args"][0] == "nginx-sidecar" and gw["image"] == ng["image"]
    gw_opts, ng_opts = gateway.parse(gw["args"][1:]), sidecar.parse(ng["args"][1:])
    assert gw_opts.nginx_sidecar and gw_opts.pod_addresses

    def volume_at(c: dict[str, Any], path: str) -> str:
        return next(m["name"] for m in c["volumeMounts"] if m["mountPath"] == path)

    shared = volume_at(gw, str(gw_opts.state_dir))
    assert shared == volume_at(ng, str(ng_opts.state_dir))
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == shared)
    assert pod["securityContext"]["runAsUser"] and not any(
        "runAsUser" in (c.get("securityContext") or {}) for c in containers.values())  # one user: signals allowed
    assert ng_opts.stop_timeout < pod.get("terminationGracePeriodSeconds", 30)  # a graceful stop ends before SIGKILL

    assert deployment["spec"]["replicas"] >= 3
    probe = gw["readinessProbe"]["httpGet"]
    port = next(p["containerPort"] for p in gw["ports"] if p["name"] == probe["port"])
    assert probe["path"] == "/readyz" and port == int(gw_opts.listen.rsplit(":", 1)[1] if gw_opts.listen else
                                                      defaults.listen("gateway").rsplit(":", 1)[1])
    pdb = _docs(DEPLOY / "disruption" / "gateway-pdb.yaml")[0]
    assert pdb["kind"] == "PodDisruptionBudget" and pdb["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert 1 <= pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def _crd_with(field: dict[str, Any]) -> str:
    return yaml.safe_dump({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "properties": {"spec": {"type": "object", "properties": {"size": field}}}}}}]}})


def test_a_crd_whose_value_validations_declare_types_is_refused_on_both_servers(server_kind: str, tmp_path: Path) -> None:
    """A structural schema declares types once, outside anyOf/allOf/oneOf/not: an int-or-string field
    whose anyOf branches carry a bound besides their type is refused, by the sandbox as by
    kube-apiserver, naming the field; the same bounds beside the anyOf are accepted."""
    import live_server

    server = live_server.start(server_kind, tmp_path)
    try:
        refused = server.kubectl("apply", "-f", "-", check=False, input=_crd_with(
            {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer", "minimum": 0}, {"type": "string"}]}))
        assert refused.returncode != 0
        assert "properties[size].anyOf[0].type: Forbidden: must be empty to be structural" in refused.stderr
        accepted = server.kubectl("apply", "-f", "-", input=_crd_with(
            {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}], "minimum": 0,
             "pattern": "^[0-9]+m$"}))
        assert "widgets.example.com created" in accepted.stdout
    finally:
        server.close()
