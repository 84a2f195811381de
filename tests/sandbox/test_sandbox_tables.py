"""`kubectl get` of the built-in kinds prints the columns kube-apiserver's table printers give
(ConfigMaps: NAME, DATA, AGE; Secrets: NAME, TYPE, DATA, AGE; ...), through real kubectl. The
sandbox printed NAME and AGE for every built-in kind."""

from __future__ import annotations

import json
import re

import pytest

from sandbox_proc import SandboxProcess

OBJECTS = [
    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "conf"}, "data": {"a": "1", "b": "2"},
     "binaryData": {"c": "AA=="}},
    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "empty"}},
    {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"}, "stringData": {"user": "u", "pass": "p"}},
    {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tls"}, "type": "kubernetes.io/tls",
     "data": {"tls.crt": "", "tls.key": ""}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
     "spec": {"selector": {"app": "web", "tier": "front"}, "externalIPs": ["192.0.2.9"],
              "ports": [{"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}]}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ext"},
     "spec": {"type": "ExternalName", "externalName": "example.com"}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "lb"},
     "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.7", "ports": [{"port": 443, "nodePort": 30443}]}},
    {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "web-a"},
     "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}, {"name": "named"}],
     "endpoints": [{"addresses": [f"10.1.0.{i}"]} for i in range(1, 6)]},
    {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "web-b"},
     "addressType": "IPv4", "endpoints": []},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "reader"},
     "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "read"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "reader"},
     "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": "default"},
                  {"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}]},
    {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "leader"},
     "spec": {"holderIdentity": "pod-1"}},
    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app"},
     "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "a"},
                                          "matchExpressions": [{"key": "tier", "operator": "In", "values": ["y", "x"]}]},
              "template": {"metadata": {"labels": {"app": "a", "tier": "x"}},
                           "spec": {"containers": [{"name": "web", "image": "nginx:1"},
                                                   {"name": "side", "image": "busybox"}]}}}},
    {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "app.1"}, "type": "Warning", "reason": "Failed",
     "message": " it broke ", "involvedObject": {"kind": "Deployment", "name": "app", "namespace": "default"},
     "source": {"component": "tester"}, "count": 3},
]


@pytest.fixture(scope="module")
def sb(tmp_path_factory):
    with SandboxProcess(tmp_path_factory.mktemp("sandbox")) as s:
        s.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": OBJECTS}))
        yield s


def printed(sb: SandboxProcess, *args: str) -> list[list[str]]:
    """kubectl's table, one list of cells per line (the header first), with ages as `AGE`."""
    out = sb.kubectl("get", *args).stdout
    return [[re.sub(r"^\d+s$", "AGE", cell) for cell in re.split(r"\s{2,}", line.strip())]
            for line in out.splitlines() if line.strip()]


def test_configmaps_show_how_many_keys_they_hold(sb):
    assert printed(sb, "configmaps") == [["NAME", "DATA", "AGE"], ["conf", "3", "AGE"], ["empty", "0", "AGE"]]


def test_secrets_show_their_type_and_keys(sb):
    assert printed(sb, "secrets") == [["NAME", "TYPE", "DATA", "AGE"], ["creds", "Opaque", "2", "AGE"],
                                      ["tls", "kubernetes.io/tls", "2", "AGE"]]


def test_services_show_type_ips_and_ports_and_wide_the_selector(sb):
    assert printed(sb, "services") == [
        ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"],
        ["ext", "ExternalName", "<none>", "example.com", "<none>", "AGE"],
        ["lb", "LoadBalancer", "10.96.0.7", "<pending>", "443:30443/TCP", "AGE"],
        ["web", "ClusterIP", "10.96.0.1", "192.0.2.9", "80/TCP,53/UDP", "AGE"]]
    assert printed(sb, "services", "web", "-o", "wide") == [
        ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE", "SELECTOR"],
        ["web", "ClusterIP", "10.96.0.1", "192.0.2.9", "80/TCP,53/UDP", "AGE", "app=web,tier=front"]]


def test_endpointslices_show_at_most_three_ports_and_addresses(sb):
    assert printed(sb, "endpointslices") == [
        ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"],
        ["web-a", "IPv4", "8080,named", "10.1.0.1,10.1.0.2,10.1.0.3 + 2 more...", "AGE"],
        ["web-b", "IPv4", "<unset>", "<unset>", "AGE"]]


def test_namespaces_show_their_phase(sb):
    rows = printed(sb, "namespaces")
    assert rows[0] == ["NAME", "STATUS", "AGE"]
    assert ["default", "Active", "AGE"] in rows[1:]


def test_rbac_leases_and_crds(sb):
    roles = printed(sb, "clusterroles")
    assert roles[0] == ["NAME", "CREATED AT"]
    assert roles[1][0] == "reader" and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", roles[1][1])
    assert printed(sb, "rolebindings") == [["NAME", "ROLE", "AGE"], ["read", "ClusterRole/reader", "AGE"]]
    assert printed(sb, "rolebindings", "-o", "wide") == [
        ["NAME", "ROLE", "AGE", "USERS", "GROUPS", "SERVICEACCOUNTS"],
        ["read", "ClusterRole/reader", "AGE", "alice", "default/bot"]]  # the empty GROUPS cell is blank
    assert printed(sb, "leases") == [["NAME", "HOLDER", "AGE"], ["leader", "pod-1", "AGE"]]
    sb.kubectl("apply", "--server-side", "-f", "-", input=json.dumps({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.io"},
        "spec": {"group": "example.io", "scope": "Namespaced",
                 "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object"}}}]}}))
    crds = printed(sb, "crd", "widgets.example.io")
    assert crds[0] == ["NAME", "CREATED AT"] and crds[1][0] == "widgets.example.io"


def test_deployments_and_events(sb):
    assert printed(sb, "deployments") == [["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"], ["app", "0/2", "0", "0", "AGE"]]
    assert printed(sb, "deployments", "-o", "wide") == [
        ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"],
        ["app", "0/2", "0", "0", "AGE", "web,side", "nginx:1,busybox", "app=a,tier in (x,y)"]]
    # no first or last timestamp given: LAST SEEN is <unknown>, as kube-apiserver prints a zero time
    assert printed(sb, "events") == [["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
                                     ["<unknown>", "Warning", "Failed", "deployment/app", "it broke"]]
