"""Services get cluster IPs from the server's range, on the sandbox (`--service-cidr`) as on
kube-apiserver (`--service-cluster-ip-range`): one address each, never two Services the same, none
for headless and ExternalName Services, a requested address outside the range refused in
kube-apiserver's words."""

from __future__ import annotations

import ipaddress
import json

import live_server
from kube_apiserver import SERVICE_RANGE

SANDBOX_RANGE = "198.19.0.0/16"


def _svc(name: str, **spec) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
            "spec": {"ports": [{"port": 80}], **spec}}


def test_services_get_distinct_cluster_ips_from_the_range(server_kind, tmp_path):
    server = live_server.start(server_kind, tmp_path, "--service-cidr", SANDBOX_RANGE)
    net = ipaddress.ip_network(SANDBOX_RANGE if server_kind == "sandbox" else SERVICE_RANGE)
    try:
        names = [f"s{i}" for i in range(5)]
        server.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [_svc(n) for n in names]}))
        server.kubectl("apply", "-f", "-", input=json.dumps(_svc("headless", clusterIP="None")))
        server.kubectl("apply", "-f", "-", input=json.dumps({**_svc("ext", type="ExternalName", externalName="example.com"),
                                                              "spec": {"type": "ExternalName", "externalName": "example.com"}}))
        specs = {n: json.loads(server.kubectl("get", "svc", n, "-o", "json").stdout)["spec"] for n in names}
        ips = [s["clusterIP"] for s in specs.values()]
        assert len(set(ips)) == len(ips), ips
        for s in specs.values():
            assert ipaddress.ip_address(s["clusterIP"]) in net and s["clusterIPs"] == [s["clusterIP"]], s
            assert s["ipFamilies"] == ["IPv4"] and s["ipFamilyPolicy"] == "SingleStack", s
        assert json.loads(server.kubectl("get", "svc", "headless", "-o", "json").stdout)["spec"]["clusterIP"] == "None"
        assert "clusterIP" not in json.loads(server.kubectl("get", "svc", "ext", "-o", "json").stdout)["spec"]
        # an ExternalName Service made a ClusterIP one gets its address then
        server.kubectl("apply", "-f", "-", input=json.dumps(_svc("ext")))
        moved = json.loads(server.kubectl("get", "svc", "ext", "-o", "json").stdout)["spec"]
        assert ipaddress.ip_address(moved["clusterIP"]) in net and moved["clusterIP"] not in ips, moved
        ips.append(moved["clusterIP"])
        # a re-apply without the address keeps it
        server.kubectl("apply", "-f", "-", input=json.dumps(_svc("s0")))
        assert json.loads(server.kubectl("get", "svc", "s0", "-o", "json").stdout)["spec"]["clusterIP"] == specs["s0"]["clusterIP"]
        # an address that is taken, or outside the range, is refused
        taken = server.kubectl("apply", "-f", "-", input=json.dumps(_svc("dup", clusterIP=ips[1])), check=False)
        assert taken.returncode == 1 and f"failed to allocate IP {ips[1]}: provided IP is already allocated" in taken.stderr
        out = server.kubectl("apply", "-f", "-", input=json.dumps(_svc("out", clusterIP="192.0.2.1")), check=False)
        assert out.returncode == 1 and out.stderr.strip().endswith(
            'spec.clusterIPs: Invalid value: ["192.0.2.1"]: failed to allocate IP 192.0.2.1: the provided network does not '
            "match the current range"), out.stderr
        # a free address in the range is given as asked; a deleted Service's address is free again
        free = str(next(h for h in net.hosts() if str(h) not in ips and int(h) & 0xff > 200))
        server.kubectl("apply", "-f", "-", input=json.dumps(_svc("asked", clusterIP=free)))
        assert json.loads(server.kubectl("get", "svc", "asked", "-o", "json").stdout)["spec"]["clusterIPs"] == [free]
        server.kubectl("delete", "svc", "asked")
        server.kubectl("apply", "-f", "-", input=json.dumps(_svc("again", clusterIP=free)))
    finally:
        server.close()
