"""Bad input of every kind ends in a message naming file, object and field, never a traceback."""

from __future__ import annotations

import json

import orjson
import pytest
import yaml

from gwpolicy.engine.analysis import analyse
from gwpolicy.engine.shapes import MAX_DEPTH, object_problem
from helpers import ROOT, run_cli

NOW = "2026-01-01T00:00:00Z"
PARABLE = ROOT / "examples" / "parable"


def _parable() -> list[dict]:
    return [d for f in sorted(PARABLE.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def _nested(depth: int):
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def _cake_retries(objs: list[dict]) -> dict:
    return next(o for o in objs if o["metadata"]["name"] == "cake-retries")


# a setting of a policy (so that, were it let through, it would reach `effective -o json`) set to a value
# JSON cannot hold, as YAML writes it
UNREPRESENTABLE = [
    ("2^64", "x: 18446744073709551616", "spec.defaults.x: the integer 18446744073709551616 does not fit in 64 bits"),
    ("-2^63-1", "x: -9223372036854775809", "spec.defaults.x: the integer -9223372036854775809 does not fit in 64 bits"),
    ("key", "7: seven", "spec.defaults: has a key that is not a string (7); JSON keys are strings"),
    ("binary", "x: !!binary aGVsbG8=", "spec.defaults.x: binary data (!!binary) is not a JSON value"),
    ("set", "x: !!set {a, b}", "spec.defaults.x: a set (!!set) is not a JSON value; write a list"),
    ("nan", "x: .nan", "spec.defaults.x: nan is not a number JSON can hold"),
    ("inf", "x: -.inf", "spec.defaults.x: -inf is not a number JSON can hold"),
]


@pytest.mark.parametrize("name,setting,message", UNREPRESENTABLE, ids=[u[0] for u in UNREPRESENTABLE])
def test_values_json_cannot_hold_are_rejected_before_any_output(tmp_path, name, setting, message):
    policy = tmp_path / "bad.yaml"
    policy.write_text(
        "apiVersion: policy.acme.io/v1\nkind: RetryPolicy\n"
        "metadata: {name: odd, namespace: baker, creationTimestamp: '2020-01-01T00:00:00Z'}\n"
        "spec:\n  targetRef: {group: gateway.networking.k8s.io, kind: HTTPRoute, name: cake}\n"
        f"  defaults:\n    {setting}\n")
    for cmd in (["effective", "-o", "json"], ["effective", "-o", "yaml"], ["status", "-o", "json"],
                ["get", "retrypolicies", "-n", "baker", "-o", "json"]):
        run = run_cli(*cmd, "-f", str(PARABLE), "-f", str(policy), "--now", NOW)
        assert run.code == 0, (cmd, run.err)
        assert f"Warning: {policy}:1: RetryPolicy baker/odd: {message}" in run.err, (cmd, run.err)
        assert "odd" not in run.out  # the object is left out; the rest is analysed
        doc = orjson.loads(run.out) if cmd[-1] == "json" else yaml.safe_load(run.out)
        assert doc["items"], cmd


def test_nesting_deeper_than_the_limit_is_rejected_and_the_limit_itself_is_not(tmp_path):
    def policy(depth: int) -> dict:
        # the object nests 4 levels above the value: the object, spec, defaults, x
        return {"apiVersion": "policy.acme.io/v1", "kind": "RetryPolicy",
                "metadata": {"name": f"deep{depth}", "namespace": "baker"},
                "spec": {"targetRef": {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "cake"},
                         "defaults": {"x": _nested(depth)}}}
    at_limit, beyond = policy(MAX_DEPTH - 3), policy(MAX_DEPTH - 2)
    assert object_problem(at_limit) is None
    assert object_problem(beyond).endswith(f"nests more than {MAX_DEPTH} levels deep")
    path = tmp_path / "deep.json"
    path.write_text(json.dumps([at_limit, policy(400)]))
    run = run_cli("effective", "-o", "json", "-f", str(path), "--now", NOW)
    assert run.code == 0, run.err
    assert f"{path}:1: RetryPolicy baker/deep400: spec.defaults.x[0]" in run.err
    assert f"nests more than {MAX_DEPTH} levels deep; skipped" in run.err
    orjson.loads(run.out)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_documents_the_parser_gives_up_on_are_errors_with_the_file(tmp_path, suffix):
    deep = tmp_path / f"deep{suffix}"
    deep.write_text("[" * 5000 + "]" * 5000)
    run = run_cli("get", "policies", "-f", str(deep))
    assert run.code == 1 and "unexpected" not in run.err, run.err
    assert run.err.startswith(f"Error: {deep}:1: invalid "), run.err
    long_int = tmp_path / f"long{suffix}"
    body = '{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},\n"spec": {"x": ' + "9" * 5000 + "}}"
    long_int.write_text(body)
    run = run_cli("get", "policies", "-f", str(long_int))
    assert run.code == 1 and "unexpected" not in run.err, run.err
    assert run.err.startswith(f"Error: {long_int}:2: invalid ") and "an integer of 5000 digits" in run.err, run.err


def test_malformed_objects_of_every_kind_the_engine_reads(tmp_path):
    """One malformed object of each kind beside the parable: each is named by field; the rest is analysed."""
    cases = [
        ({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "odd", "labels": {"tier": 1}}},
         "Namespace odd: metadata.labels.tier: must be a string, not a number (1)"),
        ({"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
          "metadata": {"name": "g", "namespace": "baker"}, "spec": {"from": [{"kind": "HTTPRoute"}], "to": []}},
         "ReferenceGrant baker/g: spec.from[0].namespace: is required"),
        ({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
          "metadata": {"name": "odds.example.io"},
          "spec": {"group": "example.io", "names": {"kind": "OddPolicy"}, "scope": "Namespaced",
                   "versions": [{"name": "v1", "schema": {"openAPIV3Schema": {"properties": {"spec": {"properties": []}}}}}]}},
         "CustomResourceDefinition odds.example.io: spec.versions[0].schema.openAPIV3Schema.properties.spec.properties: "
         "must be an object, not a list"),
        ({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "r", "namespace": "baker"},
          "spec": {"parentRefs": [{"name": "prod-web", "namespace": "infra", "port": "80"}]}},
         "HTTPRoute baker/r: spec.parentRefs[0].port: must be an integer, not a string ('80')"),
        ({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "r2", "namespace": "baker"},
          "spec": {"rules": [{"backendRefs": [{"name": "cake", "port": True}]}]}},
         "HTTPRoute baker/r2: spec.rules[0].backendRefs[0].port: must be an integer, not true"),
        ({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
          "metadata": {"name": "r3", "namespace": "baker"},
          "status": {"parents": [{"parentRef": {"name": ["prod-web"]}, "controllerName": "x"}]}},
         "HTTPRoute baker/r3: status.parents[0].parentRef.name: must be a string, not a list"),
        ({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "g", "namespace": "infra"},
          "spec": {"gatewayClassName": "acme-lb", "listeners": [{"protocol": "HTTP", "port": 80}]}},
         "Gateway infra/g: spec.listeners[0].name: is required"),
        ({"apiVersion": "gwpolicy.io/v1alpha1", "kind": "PolicyKind", "metadata": {"name": "pk"},
          "spec": {"group": "x.io", "kind": "XPolicy", "targetKinds": "Service"}},
         "PolicyKind pk: spec.targetKinds: must be a list, not a string ('Service')"),
        ({"apiVersion": "policy.acme.io/v1", "kind": "RetryPolicy",
          "metadata": {"name": "p", "namespace": "baker", "creationTimestamp": 5}, "spec": {}},
         "RetryPolicy baker/p: metadata.creationTimestamp: must be a string or a time, not a number (5)"),
        ({"apiVersion": 1, "kind": "Service", "metadata": {"name": "s"}}, "apiVersion"),
    ]
    path = tmp_path / "odd.yaml"
    path.write_text(yaml.safe_dump_all([c[0] for c in cases], sort_keys=False))
    run = run_cli("get", "policies", "-A", "-f", str(PARABLE), "-f", str(path), "--now", NOW)
    assert run.code == 0, run.err
    for _, message in cases[:-1]:
        assert f": {message}; skipped" in run.err, (message, run.err)
        assert sum(message in line for line in run.err.splitlines()) == 1
    assert "baker-retries" in run.out and "unexpected" not in run.err


def test_objects_from_a_cluster_are_checked_too():
    """The controller and live mode give objects without origins: the check is where objects are indexed."""
    objs = _parable()
    svc = next(o for o in objs if o["kind"] == "Service")
    svc["spec"]["ports"] = 5
    a = analyse(objs, now=NOW)
    name = f"Service {svc['metadata']['namespace']}/{svc['metadata']['name']}"
    assert any(w.startswith("object ") and f": {name}: spec.ports: must be a list, not a number (5); skipped" in w
               for w in a.warnings), a.warnings
    assert a.effective


def test_now_must_be_a_time_and_is_written_in_utc():
    for bad in ("garbage", "2026-01-01", "2026-01-01T00:00:00", "2026-13-01T00:00:00Z"):
        run = run_cli("status", "-o", "json", "-f", str(PARABLE), "--now", bad)
        assert run.code == 1 and run.out == "", (bad, run.out[:200])  # kubectl's exit code for a bad flag
        assert "argument --now:" in run.err and "Traceback" not in run.err, run.err
    run = run_cli("status", "-o", "json", "-f", str(PARABLE), "--now", "2026-01-01T02:30:00+02:00")
    assert run.code == 0, run.err
    times = {c["lastTransitionTime"] for item in run.json()["items"] for e in item["status"].get("ancestors", [])
             for c in e["conditions"]}
    assert "2026-01-01T00:30:00Z" in times and not any("+02:00" in t for t in times)


def test_sandbox_and_bench_arguments_are_errors_not_tracebacks(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Service\nmetadata: [\n")
    run = run_cli("sandbox", "-f", str(bad))
    assert run.code == 1 and run.err.startswith(f"Error: {bad}:"), run.err
    for argv in (["sandbox", "--port", "99999"], ["sandbox", "--port", "http"], ["sandbox", "--bookmark-interval", "-1"],
                 ["bench", "run", "--sizes", "x"], ["bench", "run", "--sizes", "1000,-5"], ["bench", "run", "--repeat", "0"],
                 ["bench", "generate", "--routes", "many"]):
        run = run_cli(*argv)
        assert run.code == 1, (argv, run.err)  # kubectl's exit code for a bad flag
        assert "Error: argument" in run.err and "Traceback" not in run.err, (argv, run.err)
    run = run_cli("bench", "generate", "--routes", "1", "-o", str(tmp_path / "no" / "such" / "dir.yaml"))
    assert run.code == 1 and run.err.startswith("Error: "), run.err


def test_sandbox_preload_leaves_out_malformed_objects(tmp_path):
    import io

    from gwpolicy.sandbox.seed import well_shaped

    objs = _parable()
    svc = next(o for o in objs if o["kind"] == "Service")
    svc["spec"]["ports"] = [{"name": {"a": 1}}]
    warn = io.StringIO()
    kept = well_shaped(objs, [f"f.yaml:{i}" for i in range(len(objs))], warn)
    assert len(kept) == len(objs) - 1 and svc not in kept
    assert "spec.ports[0].name: must be a string, not an object; skipped" in warn.getvalue()


def test_describe_cuts_long_values_and_effective_has_them_whole(tmp_path):
    objs = _parable()
    policy = _cake_retries(objs)
    long_value = "x" * 200_000
    policy["spec"]["defaults"]["note"] = long_value
    policy["spec"]["defaults"]["lines"] = "one\ntwo"
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump_all(objs, sort_keys=False))
    run = run_cli("describe", "httproute/cake", "-n", "baker", "-f", str(path), "--now", NOW)
    assert run.code == 0, run.err
    assert len(run.out) < 20_000, len(run.out)  # not a row padded to 200k characters per field
    assert "x" * 77 + "..." in run.out and "x" * 81 not in run.out
    assert "`gwpolicy effective -o json` has them whole" in run.out
    assert "one two" in run.out  # one line per row
    widths = {len(line) for line in run.out.splitlines() if line.startswith("    maxRetries")}
    assert widths and max(widths) < 400, widths
    run = run_cli("describe", "retrypolicy/cake-retries", "-n", "baker", "-f", str(path), "--now", NOW)
    assert run.code == 0 and len(run.out) < 20_000, len(run.out)
    run = run_cli("effective", "-o", "json", "-f", str(path), "--now", NOW)
    notes = {item["spec"].get("note") for item in run.json()["items"] if item["policyKind"]["kind"] == "RetryPolicy"}
    assert long_value in notes


def test_the_controllers_fast_path_leaves_a_malformed_object_to_a_full_analysis():
    """An update in place (incremental) would read the malformed fields; it declines, and the full analysis
    the controller then runs leaves the object out and says why."""
    from gwpolicy.engine.inplace.apply import policy_ref
    from gwpolicy.engine.inplace.hierarchy import update_route
    from gwpolicy.engine.inplace.policies import update_policy
    from gwpolicy.engine.refs import GATEWAY_GROUP, Ref

    objs = _parable()
    a = analyse(json.loads(json.dumps(objs)), now=NOW)
    route = json.loads(json.dumps(next(o for o in objs if o["kind"] == "HTTPRoute")))
    route["spec"]["parentRefs"] = 1.5
    ref = Ref(GATEWAY_GROUP, "HTTPRoute", route["metadata"]["namespace"], route["metadata"]["name"])
    assert update_route(a, ref, route) is None
    policy = json.loads(json.dumps(_cake_retries(objs)))
    policy["status"] = {"ancestors": [{"ancestorRef": {"name": ["cake"]}, "controllerName": "gwpolicy.io/policy-controller"}]}
    assert update_policy(a, policy_ref(a, policy), policy) is None
    full = analyse([o for o in objs if o["metadata"]["name"] != "cake-retries"] + [policy], now=NOW)
    assert any("RetryPolicy baker/cake-retries: status.ancestors[0].ancestorRef.name: must be a string" in w
               for w in full.warnings)


EVERY_FIELD = ROOT / "tests" / "data" / "every-field.yaml"


def test_a_list_map_key_that_is_no_scalar_leaves_the_policy_out():
    """The merge identifies the items of an `x-kubernetes-list-type: map` list by their keys (S5.1)."""
    from gwpolicy.engine.inplace.apply import policy_ref
    from gwpolicy.engine.inplace.policies import update_policy

    objs = [d for d in yaml.safe_load_all(EVERY_FIELD.read_text()) if d]
    policy = next(o for o in objs if o["metadata"]["name"] == "ns")
    bad = json.loads(json.dumps(policy))
    bad["spec"]["defaults"]["rules"][1]["name"] = {"b": 1}
    a = analyse(json.loads(json.dumps(objs)), now=NOW)
    assert update_policy(a, policy_ref(a, bad), bad) is None  # the fast path declines
    full = analyse([o for o in objs if o is not policy] + [bad], now=NOW)
    assert any("TimeoutPolicy app/ns: spec.defaults.rules[1].name: must be a string, number or boolean" in w
               for w in full.warnings), full.warnings
    assert full.effective and not any(p.name == "ns" for p in full.policies)


def test_whatif_names_a_malformed_object_of_the_edit_by_its_file(tmp_path):
    edit = tmp_path / "edit.yaml"
    edit.write_text("apiVersion: policy.acme.io/v1\nkind: RetryPolicy\n"
                    "metadata: {name: cake-retries, namespace: baker, labels: [a]}\n"
                    "spec: {targetRef: {group: gateway.networking.k8s.io, kind: HTTPRoute, name: cake}}\n")
    run = run_cli("whatif", "-f", str(PARABLE), "--apply", str(edit), "-n", "baker", "--now", NOW)
    assert run.code == 0, run.err
    assert (f"Warning: {edit}:1: RetryPolicy baker/cake-retries: metadata.labels: must be an object, not a list; skipped"
            in run.err), run.err
    assert "would change." in run.out or "0 settings would change" in run.out, run.out


@pytest.mark.parametrize("field,value,message", [
    ("sectionName", 80, "sectionName: must be a string, not a number (80)"),
    ("namespace", 5, "namespace: must be a string, not a number (5)"),
    ("group", ["gateway.networking.k8s.io"], "group: must be a string, not a list"),
])
def test_a_target_field_of_the_wrong_type_makes_the_policy_invalid(tmp_path, field, value, message):
    """Dropping the field would widen the policy's scope silently (a sectionName ignored attaches to the whole route)."""
    target = {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "cake", field: value}
    for spec in ({"targetRefs": [target]}, {"targetRef": target}):
        policy = {"apiVersion": "policy.acme.io/v1", "kind": "RetryPolicy",
                  "metadata": {"name": "odd", "namespace": "baker", "creationTimestamp": "2020-01-01T00:00:00Z"},
                  "spec": dict(spec, defaults={"maxRetries": 9})}
        path = tmp_path / "odd.yaml"
        path.write_text(yaml.safe_dump(policy))
        run = run_cli("status", "-o", "json", "-f", str(PARABLE), "-f", str(path), "--now", NOW)
        assert run.code == 0, run.err
        item = next(i for i in run.json()["items"] if i["object"]["name"] == "odd")
        conds = [c for e in item["status"]["ancestors"] for c in e["conditions"]]
        where = "spec.targetRefs[0]." if "targetRefs" in spec else "spec.targetRef."
        assert [(c["status"], c["reason"]) for c in conds] == [("False", "Invalid")], conds
        assert conds[0]["message"] == where + message
        effective = run_cli("effective", "-o", "json", "-f", str(PARABLE), "-f", str(path), "--now", NOW).json()
        assert not any("odd" in str(i["sources"]) for i in effective["items"])


def test_a_crd_schema_nested_hundreds_of_levels_is_reported_not_a_recursion_error(tmp_path):
    schema = '{"type": "object"}'
    for _ in range(450):  # as deep as the JSON parser reads; the shape check of a schema recurses per level
        schema = '{"type": "object", "properties": {"a": ' + schema + "}}"
    crd = ('{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "xs.x.io"},'
           ' "spec": {"group": "x.io", "names": {"kind": "XPolicy"}, "versions": [{"name": "v1", "schema": {"openAPIV3Schema": '
           + schema + "}}]}}")
    path = tmp_path / "crd.json"
    path.write_text(crd)
    run = run_cli("get", "policykinds", "-f", str(path), "-f", str(PARABLE), "--now", NOW)
    assert run.code == 0, run.err
    assert f"{path}:1: CustomResourceDefinition xs.x.io: spec.versions[0].schema.openAPIV3Schema" in run.err, run.err
    assert f"nests more than {MAX_DEPTH} levels deep; skipped" in run.err


def test_a_reader_that_stops_early_is_no_error(tmp_path):
    """`gwpolicy effective -o json | head`: the streamed output meets a closed pipe; kubectl exits
    quietly then, and so does gwpolicy (no 'unexpected BrokenPipeError')."""
    import subprocess
    import sys
    from pathlib import Path

    from gwpolicy.bench.generate import write_yaml

    big = tmp_path / "cluster.yaml"
    write_yaml(500, str(big))
    gw = Path(sys.executable).parent / "gwpolicy"
    proc = subprocess.Popen([str(gw), "effective", "-f", str(big), "-A", "-o", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(100)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 0, err
    assert "unexpected" not in err and "Traceback" not in err, err
