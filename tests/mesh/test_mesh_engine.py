"""The engine's mesh model (engine/mesh.py) as a data plane reads it, and the mesh rules that must
hold for every input (docs/semantics.md, "Mesh (east-west)")."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gen import cluster
from gwpolicy.engine.analysis import analyse
from gwpolicy.engine.inplace.apply import apply_change
from gwpolicy.engine.mesh import ANY, effective_from, path_consumer
from gwpolicy.engine.refs import Ref
from gwpolicy.files.output import effective_list, encode, status_list
from helpers import NOW, run_cli, write_manifests
from test_incremental_topology import UNREAD, canonical, key, unread_change

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
XMESH = {"apiVersion": "gateway.networking.x-k8s.io/v1alpha1", "kind": "XMesh", "metadata": {"name": "mesh"},
         "spec": {"controllerName": "gwpolicy.io/mesh-controller"}}


def service(ns: str, name: str, ports: list[tuple[str, int]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"app": name}, "ports": [{"name": n, "port": p} for n, p in ports]}}


def route(ns: str, name: str, svc_ns: str, port: int | None = None, age: int = 1) -> dict[str, Any]:
    parent: dict[str, Any] = {"group": "", "kind": "Service", "name": "s", "namespace": svc_ns}
    if port is not None:
        parent["port"] = port
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": f"2024-01-0{age}T00:00:00Z"},
            "spec": {"parentRefs": [parent], "rules": [{"backendRefs": [{"name": "s", "namespace": svc_ns, "port": 80}]}]}}


S = Ref("", "Service", "b", "s")


def test_the_mesh_tells_a_data_plane_which_routes_a_request_takes() -> None:
    objs = [XMESH, service("b", "s", [("http", 80), ("admin", 9000)]),
            route("b", "rp", "b"), route("b", "rp-newer", "b", age=2), route("a", "rc", "b", port=80)]
    mesh = analyse(objs, now=NOW).topology.mesh
    assert mesh is not None
    assert mesh.routes_for("a", S, 80) == [Ref("gateway.networking.k8s.io", "HTTPRoute", "a", "rc")]
    # no consumer route of a on 9000: the producer's, oldest first
    producer = [Ref("gateway.networking.k8s.io", "HTTPRoute", "b", n) for n in ("rp", "rp-newer")]
    assert mesh.routes_for("a", S, 9000) == producer
    assert mesh.routes_for("b", S, 80) == producer
    assert mesh.routes_for("elsewhere", S, 80) == producer
    assert mesh.routes_for("a", S, 8080) == []  # no such port
    assert mesh.consumer_of("a", S) == "a" and mesh.consumer_of("elsewhere", S) == ANY


def test_a_data_plane_reads_each_namespaces_effective_policies() -> None:
    grpc = route("a", "rc", "b")
    grpc["kind"] = "GRPCRoute"
    objs = [XMESH, service("b", "s", [("http", 80)]), grpc, consumer_policy()]
    a = analyse(objs, now=NOW)
    assert a.topology.mesh is not None
    assert a.topology.mesh.routes_for("a", S, 80) == [Ref("gateway.networking.k8s.io", "GRPCRoute", "a", "rc")]
    port = S.with_section("http")
    assert {ep.result.spec["timeout"] for ep in effective_from(a, "a", port)} == {"1s"}
    assert effective_from(a, "b", port) == [] and effective_from(a, "elsewhere", port) == []
    assert effective_from(analyse(objs[1:], now=NOW), "a", port) == []  # no mesh


def test_a_namespace_with_paths_of_its_own_to_one_service_takes_namespace_stars_to_another() -> None:
    """a's consumer route of s sends some of a's requests to s-v2, so a has paths through s-v2 of its
    own; a's direct requests to s-v2 are still those of `*` (a is no consumer of s-v2, M5)."""
    split = route("a", "rc", "b")
    split["spec"]["rules"][0]["backendRefs"].append({"name": "s-v2", "namespace": "b", "port": 80})
    policy = {"apiVersion": "example.io/v1", "kind": "TimeoutPolicy", "metadata": {"name": "v2", "namespace": "b"},
              "spec": {"targetRef": {"group": "", "kind": "Service", "name": "s-v2"}, "defaults": {"timeout": "2s"}}}
    a = analyse([XMESH, service("b", "s", [("http", 80)]), service("b", "s-v2", [("http", 80)]), split, policy], now=NOW)
    v2 = Ref("", "Service", "b", "s-v2").with_section("http")
    paths = {str(ep.path) for ep in effective_from(a, "a", v2)}
    assert paths == {
        "XMesh/mesh > Namespace/a > HTTPRoute/a/rc > Namespace/b > Service/b/s > Service/b/s#http > Service/b/s-v2 > "
        "Service/b/s-v2#http",
        "XMesh/mesh > Namespace/* > Namespace/b > Service/b/s-v2 > Service/b/s-v2#http"}
    assert {str(ep.path) for ep in effective_from(a, "b", v2)} == {
        "XMesh/mesh > Namespace/b > Service/b/s-v2 > Service/b/s-v2#http"}


def test_without_an_xmesh_of_ours_there_is_no_mesh() -> None:
    other = copy.deepcopy(XMESH)
    other["spec"]["controllerName"] = "example.net/mesh"
    for objs in ([service("b", "s", [("http", 80)]), route("b", "rp", "b")],
                 [other, service("b", "s", [("http", 80)]), route("b", "rp", "b")]):
        assert analyse(objs, now=NOW).topology.mesh is None


def outputs(objs: list[dict[str, Any]]) -> tuple[bytes, bytes]:
    a = analyse(copy.deepcopy(objs), now=NOW)
    return encode(effective_list(a), "json"), encode(status_list(a), "json")


@SETTINGS
@given(cluster())
def test_an_xmesh_of_another_controller_changes_nothing(objs: list[dict[str, Any]]) -> None:
    other = copy.deepcopy(XMESH)
    other["spec"]["controllerName"] = "example.net/mesh"
    assert outputs(objs + [other]) == outputs(objs)


NAMESPACES = ["a", "b", "c"]


@st.composite
def mesh_input(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Services s in b and c, producer and consumer routes, TimeoutPolicies of every namespace on
    Services, routes and Namespaces of any namespace."""
    objs: list[dict[str, Any]] = [XMESH] + [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
                                            for n in NAMESPACES]
    for ns in ("b", "c"):
        objs.append(service(ns, "s", [("http", 80)]))
    routes = []
    for i in range(draw(st.integers(0, 3))):
        ns, svc_ns = draw(st.sampled_from(NAMESPACES)), draw(st.sampled_from(["b", "c"]))
        objs.append(route(ns, f"r{i}", svc_ns))
        routes.append((ns, f"r{i}"))
    for i in range(draw(st.integers(1, 5))):
        ns = draw(st.sampled_from(NAMESPACES))
        kind = draw(st.sampled_from(["Service", "HTTPRoute", "Namespace"]))
        if kind == "Service":
            target = {"group": "", "kind": "Service", "name": "s", "namespace": draw(st.sampled_from(["b", "c"]))}
        elif kind == "HTTPRoute" and routes:
            rns, rname = draw(st.sampled_from(routes))
            target = {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": rname, "namespace": rns}
        else:
            target = {"group": "", "kind": "Namespace", "name": ns}
        stanza = draw(st.sampled_from(["defaults", "overrides"]))
        objs.append({"apiVersion": "example.io/v1", "kind": "TimeoutPolicy",
                     "metadata": {"name": f"p{i}", "namespace": ns, "creationTimestamp": f"2024-01-0{i + 1}T00:00:00Z"},
                     "spec": {"targetRef": target, stanza: {draw(st.sampled_from(["x", "y"])): f"{ns}{i}"}}})
    return objs


@SETTINGS
@given(mesh_input())
def test_a_policy_by_the_mesh_rule_reaches_its_own_namespaces_requests_only(objs: list[dict[str, Any]]) -> None:
    a = analyse(objs, now=NOW)
    by_rule = {ref: ref.namespace for ref, outs in a.outcomes.items() if any(o.level is not None for o in outs)}
    for ep in a.effective:
        consumer = path_consumer(ep.path.levels)
        for policy in ep.result.policies:
            if policy in by_rule:
                assert consumer == by_rule[policy], (str(ep.path), policy)


@SETTINGS
@given(mesh_input())
def test_a_namespaces_requests_hold_the_paths_of_the_consumer_the_data_plane_picks(objs: list[dict[str, Any]]) -> None:
    """What `--from NS` shows of a Service port (effective_from, RequestsFrom) is, for every namespace,
    the paths of the consumer `Mesh.consumer_of` picks for its requests: its own, else `*`."""
    a = analyse(objs, now=NOW)
    mesh = a.topology.mesh
    assert mesh is not None
    for svc_ns in ("b", "c"):
        svc = Ref("", "Service", svc_ns, "s")
        port = svc.with_section("http")
        for ns in NAMESPACES + ["elsewhere"]:
            consumer = mesh.consumer_of(ns, svc)
            want = [ep for ep in a.effective_of(port) if path_consumer(ep.path.levels) == consumer]
            assert effective_from(a, ns, port) == want, (ns, str(svc))


@SETTINGS
@given(mesh_input())
def test_a_consumers_policies_never_change_another_consumers_requests(objs: list[dict[str, Any]]) -> None:
    def others(objs: list[dict[str, Any]], consumer: str) -> set[tuple[str, str, str]]:
        a = analyse(copy.deepcopy(objs), now=NOW)
        return {(str(ep.target), str(ep.path), encode(ep.result.spec, "json").decode()) for ep in a.effective
                if path_consumer(ep.path.levels) not in (None, consumer)}

    for consumer in ("a", "c"):
        # every policy of the consumer on another namespace's objects taken away
        without = [o for o in objs if not (o["kind"] == "TimeoutPolicy" and o["metadata"]["namespace"] == consumer
                                           and o["spec"]["targetRef"].get("namespace", consumer) != consumer)]
        assert others(objs, consumer) == others(without, consumer)


@SETTINGS
@given(mesh_input(), st.randoms(use_true_random=False))
def test_with_the_mesh_on_objects_the_analysis_never_reads_change_in_place(objs: list[dict[str, Any]],
                                                                            rnd: random.Random) -> None:
    """EndpointSlices, Secrets and ConfigMaps (every pod that comes or goes changes an EndpointSlice)
    are taken in place while the mesh is on, with the result of a full analysis; any other change is
    analysed in full (a policy by the mesh rule attaches at a consumer level)."""
    seeds = [{"apiVersion": api, "kind": kind, "metadata": {"name": "seed", "namespace": "a"}, **body}
             for api, kind, body in UNREAD]  # a kind new to the index is analysed in full, mesh or not
    objs = objs + copy.deepcopy(seeds)
    state = {key(o): o for o in objs}
    a = analyse(copy.deepcopy(objs), now=NOW)
    assert a.topology.mesh is not None
    for _ in range(4):
        old, new = unread_change(state, rnd)
        if new is None:
            del state[key(old)]
        else:
            state[key(new)] = new
        assert apply_change(a, copy.deepcopy(old if old is not None else new), copy.deepcopy(new)) == set()
        assert canonical(a) == canonical(analyse(copy.deepcopy(list(state.values())), now=NOW))
    policy = next(o for o in objs if o["kind"] == "TimeoutPolicy")  # mesh_input has at least one
    edited = copy.deepcopy(policy)
    edited["metadata"]["labels"] = {"edited": "yes"}
    assert apply_change(a, policy, edited) is None


def consumer_policy() -> dict[str, Any]:
    return {"apiVersion": "example.io/v1", "kind": "TimeoutPolicy",
            "metadata": {"name": "slow-calls", "namespace": "a", "creationTimestamp": "2024-01-01T00:00:00Z"},
            "spec": {"targetRef": {"group": "", "kind": "Service", "name": "s", "namespace": "b"},
                     "overrides": {"timeout": "1s"}}}


def test_explain_shows_the_consumer_level_and_the_path_json_leaves_it_out(tmp_path: Path) -> None:
    files = write_manifests(tmp_path, [XMESH, service("b", "s", [("http", 80)]), consumer_policy()])
    run = run_cli("explain", "service/s", "timeout", "-n", "b", "-f", str(files), "--now", NOW)
    assert run.code == 0, run.err
    assert "Service/b/s [for requests from namespace a]" in run.out
    items = run_cli("effective", "-f", str(files), "-o", "json", "--now", NOW).json()["items"]
    mine = [i for i in items if i["spec"] == {"timeout": "1s"}]
    assert mine and all([lv["kind"] for lv in i["path"]][:4] == ["XMesh", "Namespace", "Namespace", "Service"]
                        and i["path"][1]["name"] == "a" for i in mine)


def test_mesh_status_keeps_other_controllers_entries_writes_nothing_twice_and_takes_its_own_out_without_a_mesh(tmp_path: Path) -> None:
    rp = route("b", "rp", "b")
    theirs = {"parentRef": {"group": "", "kind": "Service", "name": "s", "namespace": "b"},
              "controllerName": "example.net/mesh", "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}
    rp["status"] = {"parents": [theirs]}
    objs = [XMESH, service("b", "s", [("http", 80)]), rp]
    files = write_manifests(tmp_path, objs)
    items = run_cli("mesh", "status", "-f", str(files), "-o", "json", "--now", NOW).json()["items"]
    written = {(i["object"]["kind"], i["object"]["name"]): i["status"] for i in items}
    parents = written[("HTTPRoute", "rp")]["parents"]
    assert parents[0] == theirs and [p["controllerName"] for p in parents] == ["example.net/mesh", "gwpolicy.io/mesh-controller"]
    # what is written already is not written again
    rp["status"] = written[("HTTPRoute", "rp")]
    mesh = dict(XMESH, status=written[("XMesh", "mesh")])
    again = write_manifests(tmp_path, [mesh, service("b", "s", [("http", 80)]), rp], "again.yaml")
    assert run_cli("mesh", "status", "-f", str(again), "-o", "json", "--now", "2030-01-01T00:00:00Z").json()["items"] == []
    # without an XMesh of ours, the mesh controller takes its own entries out and writes nothing else
    plain = write_manifests(tmp_path, [service("b", "s", [("http", 80)]), rp], "plain.yaml")
    items = run_cli("mesh", "status", "-f", str(plain), "-o", "json", "--now", NOW).json()["items"]
    assert [(i["object"]["kind"], i["object"]["name"], i["status"]["parents"]) for i in items] == [("HTTPRoute", "rp", [theirs])]
    rp["status"] = {"parents": [theirs]}
    plain = write_manifests(tmp_path, [service("b", "s", [("http", 80)]), rp], "plain2.yaml")
    assert run_cli("mesh", "status", "-f", str(plain), "-o", "json", "--now", NOW).json()["items"] == []
