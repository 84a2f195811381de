"""Loader: formats, lists, stdin, and errors that name the file, the line and the object."""

from __future__ import annotations

import json

from gwpolicy.files.load import load_text
from helpers import GATEWAY_API, needs_shared, run_cli


def test_multi_document_yaml_and_lists_are_read(tmp_path):
    text = """
apiVersion: v1
kind: Namespace
metadata: {name: a}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: b}
- apiVersion: v1
  kind: Namespace
  metadata: {name: c}
---
"""
    loaded = load_text(text, "x.yaml")
    assert [o["metadata"]["name"] for o in loaded.objects] == ["a", "b", "c"]
    assert loaded.warnings == []


def test_json_file_and_json_list(tmp_path):
    doc = {"apiVersion": "v1", "kind": "NamespaceList", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}]}
    loaded = load_text(json.dumps(doc), "x.json")
    assert [o["metadata"]["name"] for o in loaded.objects] == ["a"]


def test_malformed_yaml_fails_with_file_and_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n  labels: [unclosed\n")
    run = run_cli("effective", "-f", str(f))
    assert run.code == 1
    assert run.out == ""
    assert run.err.startswith(f"Error: {f}:")
    assert "invalid YAML" in run.err
    assert "Traceback" not in run.err
    line = int(run.err.split(":")[2])
    assert 5 <= line <= 6


def test_malformed_json_names_the_line(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text('{\n  "apiVersion": "v1",\n  "kind": \n}\n')
    run = run_cli("status", "-f", str(f))
    assert run.code == 1
    assert run.err.startswith(f"Error: {f}:4: invalid JSON")


def test_an_object_without_name_is_reported_by_position_and_the_rest_analysed(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("""apiVersion: v1
kind: Namespace
metadata: {name: ok}
---
apiVersion: networking.example.io/v1
kind: RetryPolicy
metadata: {namespace: ok}
spec: {targetRef: {kind: Namespace, name: ok}, defaults: {retries: 1}}
---
apiVersion: networking.example.io/v1
kind: RetryPolicy
metadata: {name: good, namespace: ok}
spec: {targetRef: {group: "", kind: Namespace, name: ok}, defaults: {retries: 2}}
""")
    run = run_cli("effective", "-f", str(f))
    assert run.code == 0
    assert f"{f}:5: RetryPolicy without metadata.name; skipped" in run.err
    items = run.json()["items"]
    assert [i["spec"] for i in items] == [{"retries": 2}]


def test_stdin_and_directories(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "ns.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n")
    (tmp_path / "notes.txt").write_text("not a manifest")
    policy = """apiVersion: example.io/v1
kind: RetryPolicy
metadata: {name: p, namespace: a}
spec: {targetRef: {group: "", kind: Namespace, name: a}, defaults: {retries: 2}}
"""
    run = run_cli("effective", "-f", str(tmp_path), "-f", "-", stdin=policy)
    assert run.code == 0, run.err
    assert [i["target"]["name"] for i in run.json()["items"]] == ["a"]


def test_missing_file_is_an_error_not_a_traceback(tmp_path):
    run = run_cli("effective", "-f", str(tmp_path / "nope.yaml"))
    assert run.code == 1
    assert "no such file or directory" in run.err


@needs_shared
def test_every_gateway_api_example_and_crd_loads():
    # the real upstream manifests are the loader's test input
    run = run_cli("effective", "-f", str(GATEWAY_API), "-o", "json")
    assert run.code == 0, run.err
    assert "Traceback" not in run.err
    run = run_cli("status", "-f", str(GATEWAY_API / "examples"), "-o", "yaml")
    assert run.code == 0, run.err


def test_streamed_effective_json_is_byte_for_byte_the_whole_document(tmp_path):
    import io

    import orjson

    from gwpolicy.engine.analysis import analyse
    from gwpolicy.files.load import load_paths
    from gwpolicy.files.output import effective_list, write_effective
    from helpers import ROOT

    loaded = load_paths([str(ROOT / "examples" / "parable")])
    a = analyse(loaded.objects, now="2026-01-01T00:00:00Z")
    for ns in (None, "payments", "nobody"):
        buf = io.BytesIO()
        write_effective(a, buf, "json", ns, chunk=1000)
        whole = orjson.dumps(effective_list(a, ns), option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
        assert buf.getvalue() == whole
    buf = io.BytesIO()
    write_effective(a, buf, "yaml", "payments")
    import yaml
    assert yaml.safe_load(buf.getvalue()) == effective_list(a, "payments")
    # --from keeps some paths of a target and not others (examples/mesh: each consumer's own)
    from gwpolicy.engine.mesh import RequestsFrom

    m = analyse(load_paths([str(ROOT / "examples" / "mesh")]).objects, now="2026-01-01T00:00:00Z")
    assert m.topology.mesh is not None
    for consumer in ("shop", "blog", "demo"):
        keep = RequestsFrom(m.topology.mesh, consumer).holds
        buf = io.BytesIO()
        write_effective(m, buf, "json", None, chunk=200, keep=keep)
        whole = effective_list(m, None, keep)
        assert whole["items"] and len(whole["items"]) < len(effective_list(m)["items"])
        assert buf.getvalue() == orjson.dumps(whole, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)


def _alias_bomb(levels: int = 9, width: int = 9) -> str:
    """A ConfigMap whose field `x` is a "billion laughs": `levels` anchors of `width` aliases each."""
    lines = ["apiVersion: v1", "kind: ConfigMap", "metadata: {name: bomb, namespace: default}", "x:",
             "  a0: &a0 [" + ",".join(['"lol"'] * width) + "]"]
    lines += [f"  a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_is_refused_at_once_naming_the_file(tmp_path):
    """9 anchors of 9 aliases each expand to 9^10 nodes: refused while composing, in a new
    process bounded to 30 s."""
    import subprocess
    import sys
    import time

    f = tmp_path / "bomb.yaml"
    f.write_text(_alias_bomb())
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "gwpolicy.cli.main", "render", "-f", str(f)], capture_output=True,
                         text=True, timeout=30)
    assert time.monotonic() - t0 < 30
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert f"{f}:1: invalid YAML: its aliases expand" in run.stderr and "excessive aliasing" in run.stderr


def test_an_alias_that_contains_itself_is_refused(tmp_path):
    run = run_cli("get", "configmaps", "-A", "-f", _write(tmp_path, "apiVersion: v1\nkind: ConfigMap\n"
                                                         "metadata: {name: loop, namespace: default}\nx: &a [*a]\n"))
    assert run.code == 1 and "an alias that contains itself" in run.err


def test_anchors_and_aliases_of_ordinary_size_still_load(tmp_path):
    text = ("apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n"
            "  metadata: {name: ok, namespace: default, labels: &l {app: web}}\n"
            "  data: &big {" + ", ".join(f"k{i}: v" for i in range(2000)) + "}\n"
            "- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: ok2, namespace: default, labels: *l}\n  data: *big\n")
    loaded = load_text(text, "x.yaml")
    assert [o["metadata"]["labels"] for o in loaded.objects] == [{"app": "web"}, {"app": "web"}]
    assert len(loaded.objects[1]["data"]) == 2000


def test_the_sandbox_refuses_an_alias_bomb_in_a_request_body():
    import time

    import pytest
    import yaml

    from gwpolicy.sandbox.server import _YAML_LOADER

    t0 = time.monotonic()
    with pytest.raises(yaml.YAMLError, match="excessive aliasing"):
        yaml.load(_alias_bomb(), Loader=_YAML_LOADER)
    assert time.monotonic() - t0 < 5


def _write(tmp_path, text: str) -> str:
    f = tmp_path / "m.yaml"
    f.write_text(text)
    return str(f)
