"""`--from NAMESPACE`: what applies to the requests of one namespace on mesh paths (docs/mesh.md,
docs/cli.md), for `effective`, `describe`, `explain`, `impact` and `whatif`, from files and from a
live cluster. examples/mesh: demo's Service reports with a producer route and demo's timeouts;
shop's consumer route splitting it and shop's own tighter timeout (the mesh rule); blog has
nothing of its own, so the paths of Namespace/* are what applies to it."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

import live_server
from helpers import NOW, ROOT, run_cli, write_manifests

MESH = str(ROOT / "examples" / "mesh")
PARABLE = str(ROOT / "examples" / "parable")
SCENARIOS = ROOT / "tests" / "data" / "mesh-scenarios"
XMESH_CRD = ROOT / "deploy" / "gateway-api" / "experimental" / "gateway.networking.x-k8s.io_xmeshes.yaml"


def gw(*args: str):
    return run_cli(*args, "--now", NOW)


def _field_rows(text: str, field: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.split()[:1] == [field]]


def _effective(*args: str) -> list[dict]:
    run = gw("effective", "-o", "json", *args)
    assert run.code == 0, run.err
    return run.json()["items"]


def _path(item: dict) -> str:
    return " > ".join(f"{r['kind']}/{r['name']}" for r in item["path"])


def test_describe_from_the_consumer_shows_its_route_and_its_own_timeout():
    run = gw("describe", "service/reports", "-n", "demo", "--from", "shop", "-f", MESH)
    assert run.code == 0, run.err
    out = run.out
    assert "Requests from: namespace shop: its mesh paths only" in out
    assert "HTTPRoute/shop/reports-canary" in out and "> Namespace/* >" not in out
    assert "Namespace/demo > HTTPRoute/demo/reports" not in out  # demo's producer route is not shop's
    assert {row[1] for row in _field_rows(out, "readTimeout")} == {"1s"}  # shop's override, on every path shown
    assert "TimeoutPolicy/shop/impatient" in out


def test_describe_from_a_namespace_without_paths_of_its_own_labels_namespace_star_as_its():
    run = gw("describe", "service/reports", "-n", "demo", "--from", "blog", "-f", MESH)
    assert run.code == 0, run.err
    out = run.out
    paths = [line.strip() for line in out.splitlines() if line.strip().startswith("XMesh/mesh")]
    assert paths and all(p.startswith("XMesh/mesh > Namespace/* > Namespace/demo > HTTPRoute/demo/reports") for p in paths)
    assert all(p.endswith("(Namespace/* stands for blog: it has no mesh paths of its own here)") for p in paths)
    assert {row[1] for row in _field_rows(out, "readTimeout")} == {"5s"}  # demo's default: shop's policy is shop's
    assert "TimeoutPolicy/shop/impatient" not in out and "reports-canary" not in out
    assert "Affected:      yes: 1 policy of 1 kind (TimeoutPolicy)" in out


def test_without_from_describe_shows_every_consumers_paths():
    out = gw("describe", "service/reports", "-n", "demo", "-f", MESH).out
    assert "Namespace/*" in out and "HTTPRoute/shop/reports-canary" in out and "Requests from" not in out
    assert {row[1] for row in _field_rows(out, "readTimeout")} == {"1s", "5s"}


def test_describe_policy_from_counts_only_what_it_does_to_that_namespaces_requests():
    shop = gw("describe", "timeoutpolicy/impatient", "-n", "shop", "--from", "shop", "-f", MESH).out
    assert "Affects: 2 objects (2 Service)" in shop and "Service/demo/reports-v2" in shop
    blog = gw("describe", "timeoutpolicy/impatient", "-n", "shop", "--from", "blog", "-f", MESH).out
    assert "Affects: 0 objects" in blog and "takes part in no effective policy" in blog
    assert "Accepted" in blog  # its targets and status are the policy's own, not per namespace


def test_explain_from_gives_each_namespace_its_own_ladder():
    def explained(ns: str) -> dict:
        run = gw("explain", "service/reports#http", "readTimeout", "-n", "demo", "--from", ns, "-o", "json", "-f", MESH)
        assert run.code == 0, run.err
        return run.json()

    shop, blog = explained("shop"), explained("blog")
    assert shop["from"] == "shop" and blog["from"] == "blog"
    assert [p["effective"] for p in shop["paths"]] == [{"readTimeout": "1s"}]
    assert [p["effective"] for p in blog["paths"]] == [{"readTimeout": "5s"}]
    assert [lv["name"] for lv in blog["paths"][0]["path"]][:2] == ["mesh", "*"]
    table = gw("explain", "service/reports#http", "readTimeout", "-n", "demo", "--from", "blog", "-f", MESH).out
    assert table.startswith("Requests from namespace blog: its mesh paths only (those of Namespace/* where it has "
                            "none of its own)\n\n")
    assert "(Namespace/* stands for blog" in table


def test_explain_from_a_namespace_no_policy_reaches_says_so():
    run = gw("explain", "httproute/reports-canary", "readTimeout", "-n", "shop", "--from", "blog", "-f", MESH)
    assert run.code == 1
    assert run.err == ('Error: field "readTimeout" is not set by any policy on HTTPRoute/shop/reports-canary '
                       "for requests from namespace blog\n")


def test_impact_from_counts_the_changes_for_that_namespace_only():
    shop = gw("impact", "timeoutpolicy/impatient", "-n", "shop", "--from", "shop", "-o", "json", "-f", MESH).json()
    assert shop["from"] == "shop"
    assert {(c["target"]["name"], c["target"]["sectionName"], c["before"], c["after"]) for c in shop["changes"]} == {
        ("reports", None, "1s", "5s"), ("reports", "http", "1s", "5s"),
        ("reports-v2", None, "1s", "5s"), ("reports-v2", "http", "1s", "5s")}
    blog = gw("impact", "timeoutpolicy/impatient", "-n", "shop", "--from", "blog", "-f", MESH)
    assert blog.code == 0, blog.err
    assert "TimeoutPolicy/shop/impatient affects 0 objects." in blog.out
    assert "Deleting it would change 0 effective settings." in blog.out


def test_whatif_from_sees_a_new_consumer_policy_replace_the_value_it_had(tmp_path):
    """blog takes demo's 5s through Namespace/*; a policy of its own on demo's Service makes blog a
    consumer with paths of its own: from blog, readTimeout goes from 5s to 2s."""
    policy = write_manifests(tmp_path, [{
        "apiVersion": "gwpolicy.io/v1alpha1", "kind": "TimeoutPolicy", "metadata": {"name": "blog-calls", "namespace": "blog"},
        "spec": {"targetRef": {"group": "", "kind": "Service", "name": "reports", "namespace": "demo"},
                 "overrides": {"readTimeout": "2s"}}}])
    run = gw("whatif", "--apply", str(policy), "-n", "blog", "--from", "blog", "-f", MESH)
    assert run.code == 0, run.err
    assert run.out.startswith("Requests from namespace blog: its mesh paths only")
    rows = _field_rows(run.out.replace("Service/demo/reports", "T"), "T") + _field_rows(
        run.out.replace("Service/demo/reports#http", "T"), "T")
    assert {tuple(r[2:5]) for r in rows} == {("readTimeout", "5s", "2s")}
    shop = gw("whatif", "--apply", str(policy), "-n", "blog", "--from", "shop", "-o", "json", "-f", MESH).json()
    assert shop["effective"] == [] and shop["status"]  # nothing changes for shop; status is not per namespace


def test_effective_from_keeps_only_that_namespaces_mesh_paths(tmp_path):
    gateway = [
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "web", "namespace": "demo"},
         "spec": {"gatewayClassName": "c", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "web", "namespace": "demo"},
         "spec": {"parentRefs": [{"name": "web"}], "rules": [{"backendRefs": [{"name": "reports", "port": 80}]}]}},
    ]
    both = [MESH, str(write_manifests(tmp_path, gateway))]
    every = _effective(*sum((["-f", f] for f in both), []))
    assert any(lv["kind"] == "Gateway" for item in every for lv in item["path"])  # north-south paths exist
    run = gw("effective", "-o", "json", "--from", "blog", *sum((["-f", f] for f in both), []))
    assert run.code == 0, run.err
    items = run.json()["items"]
    assert items and {(item["path"][0]["kind"], item["path"][1]["name"]) for item in items} == {("XMesh", "*")}
    assert run.err == ("Note: the items on paths of Namespace/* are what applies to requests from blog where it has "
                       "no mesh paths of its own\n")
    shop = _effective("--from", "shop", *sum((["-f", f] for f in both), []))
    assert shop and {item["path"][1]["name"] for item in shop} == {"shop"}
    assert {item["spec"]["readTimeout"] for item in shop} == {"1s"}
    # -o yaml keeps the same items
    run = gw("effective", "-o", "yaml", "--from", "shop", *sum((["-f", f] for f in both), []))
    assert yaml.safe_load(run.out)["items"] == shop


@pytest.mark.parametrize("consumer, expected", [
    ("a", {"f1": "ns-a", "f2": "route", "f3": "rule", "f4": "ns-b", "f5": "svc", "f6": "port"}),
    ("b", {"f4": "ns-b", "f5": "svc", "f6": "port"}),
    ("somewhere-else", {"f4": "ns-b", "f5": "svc", "f6": "port"}),
])
def test_effective_from_follows_the_hierarchy_scenario(tmp_path, consumer, expected):
    """tests/data/mesh-scenarios: a's requests to s port 80 take its consumer route and its Namespace's
    and route's policies; b's and any other namespace's get b's own."""
    doc = yaml.safe_load((SCENARIOS / "hierarchy-consumer-namespace-route-producer-service-port.yaml").read_text())
    f = write_manifests(tmp_path, doc["manifests"])
    items = [i for i in _effective("--from", consumer, "-f", str(f))
             if i["target"]["name"] == "s" and i["target"]["sectionName"] == "http"]
    assert len(items) == 1, [_path(i) for i in items]
    spec = items[0]["spec"]
    assert {k: v for k, v in spec.items() if k.startswith("f")} == expected


def test_effective_from_on_an_external_service(tmp_path):
    """A namespaced policy on an ExternalService is its namespace's (M9): from a, a's timeout and
    the cluster-wide retries; from any other namespace, the retries alone, on Namespace/*'s path."""
    doc = yaml.safe_load((SCENARIOS / "external-service-hostname.yaml").read_text())
    f = str(write_manifests(tmp_path, doc["manifests"]))

    def specs(consumer: str) -> list[tuple[str, dict]]:
        return [(item["path"][1]["name"], item["spec"]) for item in _effective("--from", consumer, "-f", f)
                if item["target"]["kind"] == "ExternalService"]

    assert specs("a") == [("a", {"timeout": "2s", "retries": 1})]
    assert specs("zz") == [("*", {"retries": 1})]


def test_from_without_a_mesh_is_an_error_that_says_why():
    for args in (("effective",), ("describe", "httproute/cake", "-n", "baker"),
                 ("explain", "httproute/cake", "maxRetries", "-n", "baker"),
                 ("impact", "retrypolicy/baker-retries", "-n", "baker"),
                 ("whatif", "--delete", "retrypolicy/baker-retries", "-n", "baker")):
        run = gw(*args, "--from", "baker", "-f", PARABLE)
        assert (run.code, run.out) == (1, ""), args
        assert run.err == ("Error: --from baker: the input has no XMesh of gwpolicy.io/mesh-controller, so it has no "
                           "mesh paths (requests from one namespace to a Service), and --from shows only those "
                           "(docs/mesh.md)\n"), args


def test_from_on_a_north_south_object_shows_no_effective_policy_and_why(tmp_path):
    objs = list(yaml.safe_load_all((ROOT / "examples" / "mesh" / "mesh.yaml").read_text())) + [
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "web", "namespace": "demo"},
         "spec": {"gatewayClassName": "c", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}},
        {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "TimeoutPolicy", "metadata": {"name": "gw", "namespace": "demo"},
         "spec": {"targetRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "web"},
                  "defaults": {"readTimeout": "9s"}}}]
    f = write_manifests(tmp_path, objs)
    plain = gw("describe", "gateway/web", "-n", "demo", "-f", str(f))
    assert "9s" in plain.out
    run = gw("describe", "gateway/web", "-n", "demo", "--from", "shop", "-f", str(f))
    assert run.code == 0, run.err
    assert ("<none> for requests from namespace shop: Gateway/demo/web is on no mesh path (--from shows mesh "
            "paths only)") in run.out
    row = next(line.split() for line in run.out.splitlines() if "TimeoutPolicy/demo/gw" in line)
    assert row[-1] == "no"  # it targets the Gateway, and supplies nothing to shop's requests
    assert not _field_rows(run.out, "readTimeout")


def test_from_takes_a_namespace_name():
    run = gw("describe", "service/reports", "-n", "demo", "--from", "Shop", "-f", MESH)
    assert run.code == 1 and run.err.startswith("usage: gwpolicy describe ")
    assert "Error: argument --from: 'Shop' is not a namespace name (a DNS-1123 label" in run.err
    for command in ("get", "status", "graph"):
        assert gw(command, "--from", "shop", "-f", MESH).code == 1  # not a flag of theirs


def test_from_completes_namespaces():
    run = run_cli("__complete", "describe", "-f", MESH, "--from", "")
    assert run.code == 0
    assert run.out.splitlines() == ["blog", "demo", "shop", ":4"]


# ---------------------------------------------------------------- live


@pytest.fixture
def cluster(tmp_path, server_kind):
    """examples/mesh in a cluster, with the XMesh CRD (experimental channel) and deploy/'s TimeoutPolicy CRD."""
    sb = live_server.start(server_kind, tmp_path, files=[XMESH_CRD, ROOT / "deploy" / "41-timeoutpolicy.yaml", MESH])
    try:
        yield sb
    finally:
        sb.close()


def test_from_reads_the_mesh_of_a_live_cluster(cluster):
    stored = json.loads(cluster.kubectl("get", "timeoutpolicy", "impatient", "-n", "shop", "-o", "json").stdout)
    assert stored["spec"]["targetRef"]["namespace"] == "demo"  # deploy/'s CRD keeps it
    kc = str(cluster.kubeconfig)
    shop = run_cli("describe", "service/reports", "-n", "demo", "--from", "shop", "--kubeconfig", kc)
    assert shop.code == 0, shop.err
    assert "HTTPRoute/shop/reports-canary" in shop.out
    assert {row[1] for row in _field_rows(shop.out, "readTimeout")} == {"1s"}
    blog = run_cli("explain", "service/reports#http", "readTimeout", "-n", "demo", "--from", "blog", "-o", "json",
                   "--kubeconfig", kc)
    assert blog.code == 0, blog.err
    assert [p["effective"] for p in blog.json()["paths"]] == [{"readTimeout": "5s"}]
    offline = _effective("--from", "blog", "-f", MESH)
    live = run_cli("effective", "-o", "json", "--from", "blog", "--kubeconfig", kc).json()["items"]
    assert [(_path(i), i["spec"]) for i in live] == [(_path(i), i["spec"]) for i in copy.deepcopy(offline)]
