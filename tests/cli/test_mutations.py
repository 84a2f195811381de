"""Mutated manifests thrown at every command: never an `unexpected` error, never invalid JSON.

A mutation takes one field of one object of a real input (the parable, the shared scenarios)
and swaps its type, deletes it, wraps it in a list or an object, or duplicates it. Whatever comes
out, every command must either answer (valid JSON where JSON was asked for) or say what is wrong;
an `Error: unexpected ...` is a crash site. The runs are bounded (derandomized, no example
database) so that they fit in `./dev test`: set GWPOLICY_MUTATIONS to a larger number to hunt.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import ROOT, SHARED, run_cli

SHARED_DIR = Path(os.environ.get("GWPOLICY_SHARED", SHARED))
EXAMPLES = int(os.environ.get("GWPOLICY_MUTATIONS", "0"))
NOW = "2026-01-01T00:00:00Z"

#: values a field is replaced by: every JSON type, the corners of YAML's scalars, nested shapes
REPLACEMENTS: list[Any] = [
    5, -1, 0, 1.5, float("inf"), True, False, None, "", "x", ".inf", [], {}, [1], ["x"], {"a": 1},
    {"name": {"a": 1}}, [{"name": 5}], 2 ** 64, "2026-13-45T99:00:00Z",
]


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, prefix + (i,))
    return out


def mutate(doc: dict[str, Any], choice: int, op: int, replacement: Any) -> dict[str, Any]:
    """A copy of `doc` with the field numbered `choice` changed by operation `op`."""
    doc = copy.deepcopy(doc)
    paths = _paths(doc)
    path = paths[choice % len(paths)]
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    value = parent[key]
    if op == 0:
        parent[key] = copy.deepcopy(replacement)
    elif op == 1:
        del parent[key]
    elif op == 2:
        parent[key] = [value]
    elif op == 3:
        parent[key] = {"x": value}
    else:  # duplicated: a list holds its item twice, anything else becomes a list of two copies
        if isinstance(parent, list):
            parent.insert(key, copy.deepcopy(value))
        else:
            parent[key] = [value, copy.deepcopy(value)]
    return doc


def _objects(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    if len(docs) == 1 and "manifests" in docs[0]:  # a scenario file
        return list(docs[0]["manifests"])
    return docs


def _commands(objs: list[dict[str, Any]]) -> list[list[str]]:
    """Every command, on objects the unmutated input has (a policy, a route or Gateway)."""
    def ref(o: dict[str, Any]) -> list[str]:
        meta = o["metadata"]
        return [f"{o['kind'].lower()}/{meta['name']}", "-n", meta.get("namespace", "default")]

    policy = next((o for o in objs if isinstance(o.get("spec"), dict)
                   and ("targetRef" in o["spec"] or "targetRefs" in o["spec"])), None)
    target = next((o for o in objs if o["kind"] in ("HTTPRoute", "Gateway")), objs[0])
    cmds = [
        ["get", "policies", "-A"], ["get", "policykinds"], ["get", "httproutes", "-A", "-o", "json"],
        ["describe", *ref(target)], ["explain", *ref(target)[:1], "", *ref(target)[1:]],
        ["graph", "-o", "dot"], ["graph", "-o", "mermaid"], ["effective", "-o", "json"], ["effective", "-o", "yaml"],
        ["status", "-o", "json"],
    ]
    if policy is not None:
        cmds += [["describe", *ref(policy)], ["impact", *ref(policy), "-o", "json"],
                 ["whatif", "--delete", *ref(policy), "-o", "json"]]
    return cmds


def _bases() -> list[tuple[str, list[dict[str, Any]]]]:
    bases = [("every-field", _objects(ROOT / "tests" / "data" / "every-field.yaml")),
             ("parable", [o for f in sorted((ROOT / "examples" / "parable").glob("*.yaml")) for o in _objects(f)])]
    conformance = SHARED_DIR / "conformance"
    for name in ("seeds/seed-allowed-routes.yaml", "seeds/seed-cross-namespace-needs-grant.yaml",
                 "seeds/seed-invalid-shapes.yaml", "seeds/seed-map-replaced-whole.yaml",
                 "seeds/seed-backendtlspolicy-none.yaml", "seeds/seed-breadcrumbs.yaml"):
        if (conformance / name).exists():
            bases.append((name, _objects(conformance / name)))
    return bases


BASES = _bases()


def check_every_command(tmp: Path, objs: list[dict[str, Any]], cmds: list[list[str]],
                        base: list[dict[str, Any]] | None = None, edit: dict[str, Any] | None = None) -> None:
    """Every command on the mutated objects; with `base` and `edit`, also `whatif` of the mutated object
    applied as an edit to the unmutated ones."""
    path = tmp / "mutated.yaml"
    # the Dumper writes what the Loader reads back (NaN, 2^64, non-string keys): the loader is under test too
    path.write_text(yaml.dump_all(objs, Dumper=yaml.SafeDumper, sort_keys=False))
    runs = [[*cmd, "-f", str(path)] for cmd in cmds]
    if base is not None and edit is not None:
        (tmp / "base.yaml").write_text(yaml.dump_all(base, Dumper=yaml.SafeDumper, sort_keys=False))
        (tmp / "edit.yaml").write_text(yaml.dump(edit, Dumper=yaml.SafeDumper, sort_keys=False))
        runs.append(["whatif", "-A", "-o", "json", "-f", str(tmp / "base.yaml"), "--apply", str(tmp / "edit.yaml")])
    for cmd in runs:
        run = run_cli(*cmd, "--now", NOW)
        assert "unexpected" not in run.err, (cmd, run.err, path.read_text()[:3000])
        assert run.code in (0, 1), (cmd, run.code, run.err)
        if run.code == 0 and "json" in cmd and not (cmd[0] == "get" and run.out == ""):
            # (`get` of nothing prints "No resources found" on stderr: its empty `List` is checked too)
            orjson.loads(run.out)  # strict JSON: no NaN, no partial document
        if run.code == 1:
            assert run.err.startswith("Error: ") or "\nError: " in run.err, (cmd, run.err)


@pytest.mark.parametrize("base", [b[0] for b in BASES])
def test_mutated_manifests_never_crash_a_command(base, tmp_path_factory):
    objs = dict(BASES)[base]
    cmds = _commands(objs)
    # every-field.yaml holds every field the engine reads in a small cluster: most examples go there;
    # the parable is large and every command analyses it again: fewer examples there
    examples = EXAMPLES or {"every-field": 60, "parable": 8}.get(base, 8)

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(which=st.integers(0, len(objs) - 1), choice=st.integers(0, 10 ** 6), op=st.integers(0, 4),
           replacement=st.sampled_from(REPLACEMENTS))
    def run(which, choice, op, replacement):
        mutated = list(objs)
        mutated[which] = mutate(objs[which], choice, op, replacement)
        check_every_command(tmp_path_factory.mktemp("m"), mutated, cmds, objs, mutated[which])

    run()


def test_the_known_crash_sites_are_reported_by_field(tmp_path):
    """The crash sites that once crashed a command, one object each, beside a valid one."""
    parable = dict(BASES)["parable"]
    cases = [
        ("Service", "ports", lambda o: o["spec"].__setitem__("ports", 5), "spec.ports: must be a list, not a number (5)"),
        ("HTTPRoute", "parentRefs", lambda o: o["spec"].__setitem__("parentRefs", 1.5),
         "spec.parentRefs: must be a list, not a number (1.5)"),
        ("HTTPRoute", "rules", lambda o: o["spec"].__setitem__("rules", True), "spec.rules: must be a list, not true"),
        ("HTTPRoute", "parentRef name", lambda o: o["spec"]["parentRefs"][0].__setitem__("name", {"a": 1}),
         "spec.parentRefs[0].name: must be a string, not an object"),
        ("Gateway", "hostname", lambda o: o["spec"]["listeners"][0].__setitem__("hostname", float("inf")),
         "spec.listeners[0].hostname: must be a string, not a number (inf)"),
        ("PolicyKind", "fieldMappings", lambda o: o["spec"].__setitem__("fieldMappings", 5),
         "spec.fieldMappings: must be a list, not a number (5)"),
    ]
    for kind, what, change, message in cases:
        objs = copy.deepcopy(parable)
        victim = next(o for o in objs if o["kind"] == kind and (kind != "Gateway" or o["spec"].get("listeners")))
        change(victim)
        path = tmp_path / f"{what.replace(' ', '-')}.yaml"
        path.write_text(yaml.dump_all(objs, Dumper=yaml.SafeDumper, sort_keys=False))
        run = run_cli("get", "policies", "-A", "-f", str(path), "--now", NOW)
        assert run.code == 0, (what, run.err)
        meta = victim["metadata"]
        label = f"{kind} {meta['namespace']}/{meta['name']}" if "namespace" in meta else f"{kind} {meta['name']}"
        lines = [l for l in run.err.splitlines() if message in l]
        assert lines, (what, run.err)
        # file:line: Kind ns/name: field: what is wrong
        assert lines[0].startswith(f"Warning: {path}:") and f": {label}: {message}; skipped" in lines[0], lines[0]
        assert "baker-retries" in run.out  # the rest is analysed


def test_a_string_match_labels_is_reported(tmp_path):
    objs = copy.deepcopy(dict(BASES)["parable"])
    gw = next(o for o in objs if o["kind"] == "Gateway" and o["spec"].get("listeners"))
    gw["spec"]["listeners"][0]["allowedRoutes"] = {"namespaces": {"from": "Selector", "selector": {"matchLabels": "team=a"}}}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump_all(objs, sort_keys=False))
    run = run_cli("effective", "-o", "json", "-f", str(path), "--now", NOW)
    assert run.code == 0, run.err
    assert ("spec.listeners[0].allowedRoutes.namespaces.selector.matchLabels: must be an object, not a string ('team=a')"
            in run.err)
    orjson.loads(run.out)
