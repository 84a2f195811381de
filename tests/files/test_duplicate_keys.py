"""A duplicate key in a manifest is an error naming file:line, the object and the key, as kubectl
refuses it, on both readers: PyYAML (small files, and anything the fast path declines) and the
fast path (which must decline, so that PyYAML reports it). PyYAML alone would keep the last value.
"""

from __future__ import annotations

import re

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gwpolicy import yamlfast
from gwpolicy.bench.generate import cluster
from gwpolicy.load import LoadError, load_text
from gwpolicy.load import _Loader as Strict
from helpers import run_cli

ROUTE = """\
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: cake
  namespace: baker
spec:
  parentRefs:
  - name: web
  rules:
  - backendRefs:
    - name: cake
      port: 80
      port: 8080
"""


def _big(text: str) -> str:
    """`text` after enough harmless documents that load.py tries the fast path (64 KiB and up)."""
    filler = "".join(f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c{i}\n  namespace: n\ndata:\n  k: v{i}\n---\n"
                     for i in range(1500))
    return filler + text


def test_the_command_line_refuses_a_duplicate_key_naming_file_line_object_and_key(tmp_path):
    path = tmp_path / "route.yaml"
    path.write_text(ROUTE)
    run = run_cli("effective", "-f", str(path))
    assert run.code == 1 and run.out == ""
    assert run.err == (f'Error: {path}:13: invalid YAML: duplicate key "port" at spec.rules[0].backendRefs[0].port '
                       'in HTTPRoute baker/cake (first at line 12); kubectl refuses a manifest with a duplicate key too\n')


def test_a_big_file_takes_the_same_error_through_the_fast_path(tmp_path):
    text = _big(ROUTE)
    assert len(text) >= 64 * 1024
    assert yamlfast.load_all(text) is None  # rapidyaml reads it, orjson keeps the last: declined
    assert yamlfast.load_all(text.replace("      port: 8080\n", "")) is not None
    line = text.count("\n", 0, text.index("port: 8080")) + 1
    with pytest.raises(LoadError) as err:
        load_text(text, "big.yaml")
    assert str(err.value).startswith(f'big.yaml:{line}: invalid YAML: duplicate key "port" at '
                                     'spec.rules[0].backendRefs[0].port in HTTPRoute baker/cake')


@pytest.mark.parametrize("text,line,key,where", [
    ("kind: A\nkind: B\n", 2, "kind", "at kind (first at line 1)"),
    ('metadata:\n  name: a\n  "name": b\n', 3, "name", "at metadata.name (first at line 2)"),  # quoted: the same key
    ("a: {x: 1, x: 2}\n", 1, "x", "at a.x"),  # flow mapping
    ("l:\n- k: 1\n  k: 2\n", 3, "k", "at l[0].k"),
    ("a: 1\n---\nkind: Service\nmetadata:\n  name: s\nspec:\n  ports:\n  - port: 1\n    port: 2\n", 9, "port",
     "at spec.ports[0].port in Service s (first at line 8)"),  # second document
    ("kind: List\nitems:\n- kind: Service\n  metadata: {name: s, namespace: n}\n  spec: {a: 1, a: 2}\n", 5, "a",
     "at spec.a in Service n/s"),  # an item of a List is the object named
    ("yes: 1\ntrue: 2\n", 2, "true", "at true"),  # both the boolean true in YAML 1.1
])
def test_every_form_of_duplicate_is_named(text, line, key, where):
    with pytest.raises(LoadError) as err:
        load_text(text, "m.yaml")
    message = str(err.value)
    assert message.startswith(f'm.yaml:{line}: invalid YAML: duplicate key "{key}" ') and where in message, message
    assert yamlfast.load_all(text) is None


@pytest.mark.parametrize("text,expected", [
    ('"1": a\n1: b\n', {"1": "a", 1: "b"}),  # a string and an integer are two keys (go-yaml too)
    ("base: &b {x: 1, y: 2}\nm:\n  <<: *b\n  x: 3\n", {"base": {"x": 1, "y": 2}, "m": {"x": 3, "y": 2}}),  # merge: override
    ("a: {x: 1}\nb: {x: 2}\n", {"a": {"x": 1}, "b": {"x": 2}}),  # one key in two mappings
])
def test_what_is_not_a_duplicate_reads_as_pyyaml_reads_it(text, expected):
    assert list(yaml.load_all(text, Loader=Strict)) == [expected] == list(yaml.load_all(text, Loader=yaml.SafeLoader))
    load_text(text, "m.yaml")  # no error (the documents are skipped for want of kind: not the point here)


CLUSTER_LINES = yaml.dump_all(cluster(3, 1), Dumper=yaml.SafeDumper, sort_keys=False).splitlines(keepends=True)
#: lines that hold a block mapping key (a list item's first key counts, without its `- `)
KEY_LINES = [i for i, line in enumerate(CLUSTER_LINES) if re.match(r"^[ -]*[A-Za-z][^:\n]*:(?: |$)", line)]


def _nested(line: str, indent: int) -> bool:
    col = len(line) - len(line.lstrip(" "))
    return col > indent or (col == indent and line.lstrip(" ").startswith("- "))


@settings(max_examples=120, deadline=None, derandomize=True, database=None)
@given(st.sampled_from(KEY_LINES), st.booleans(), st.sampled_from(["same", "other", "nested"]))
def test_a_key_written_twice_anywhere_in_a_cluster_is_refused_by_both_readers(index, quote, value):
    """Mutation: a key line of a synthetic cluster is written again below itself (another value,
    the same one, or a nested block). Both readers must refuse it, naming the second line."""
    line = CLUSTER_LINES[index]
    indent = len(line) - len(line.lstrip(" -"))  # the key's column (a list item's `- ` included)
    key = line.lstrip(" -").split(":", 1)[0]
    end = index + 1  # the copy goes after the entry's nested lines (an indentless sequence among them)
    while end < len(CLUSTER_LINES) and _nested(CLUSTER_LINES[end], indent):
        end += 1
    written = f'"{key}"' if quote else key
    copy = {"same": [line.lstrip(" -").replace(key, written, 1)], "other": [f"{written}: changed\n"],
            "nested": [f"{written}:\n", "  x: 1\n"]}[value]
    text = "".join(CLUSTER_LINES[:end]) + "".join(" " * indent + part for part in copy) + "".join(CLUSTER_LINES[end:])
    with pytest.raises(LoadError) as err:
        load_text(text, "c.yaml")
    assert str(err.value).startswith(f'c.yaml:{end + 1}: invalid YAML: duplicate key "{key}" '), str(err.value)
    assert yamlfast.load_all(text) is None
    assert yamlfast.load_all("".join(CLUSTER_LINES)) is not None  # the text without the copy: fast path


def test_the_same_error_with_and_without_the_fast_path_on_a_big_cluster(monkeypatch):
    """Both paths agree: a big file (fast path tried) and the same file read by PyYAML alone give
    the same message, at the same line, for a duplicate deep in the cluster."""
    text = yaml.dump_all(cluster(100, 2), Dumper=yaml.SafeDumper, sort_keys=False)
    assert len(text) >= 64 * 1024
    lines = text.splitlines(keepends=True)
    index = max(i for i in KEY_LINES_OF(lines) if lines[i].strip().startswith("name:"))
    dup = "".join(lines[:index + 1]) + lines[index] + "".join(lines[index + 1:])
    with pytest.raises(LoadError) as fast:
        load_text(dup, "c.yaml")
    monkeypatch.setattr(yamlfast, "load_all", lambda text: None)
    with pytest.raises(LoadError) as slow:
        load_text(dup, "c.yaml")
    assert str(fast.value) == str(slow.value) and f"c.yaml:{index + 2}: " in str(fast.value)
    assert len(load_text(text, "c.yaml").objects) > 100  # without the copy: read


def KEY_LINES_OF(lines: list[str]) -> list[int]:  # noqa: N802 - the constant's recipe, for other texts
    return [i for i, line in enumerate(lines) if re.match(r"^[ -]*[A-Za-z][^:\n]*:(?: |$)", line)]


def test_a_json_manifest_with_a_duplicate_key_is_refused_too(tmp_path):
    path = tmp_path / "svc.json"
    path.write_text('{"apiVersion": "v1", "kind": "Service",\n "metadata": {"name": "s", "namespace": "n"},\n'
                    ' "spec": {"ports": [{"port": 1,\n   "port": 2}]}}\n')
    run = run_cli("effective", "-f", str(path))
    assert run.code == 1
    assert run.err == (f'Error: {path}:4: invalid JSON: duplicate key "port" at spec.ports[0].port in Service n/s '
                       '(first at line 3); kubectl refuses a manifest with a duplicate key too\n')
    path.write_text('{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "n"}}')
    assert run_cli("effective", "-f", str(path)).code == 0


@pytest.mark.parametrize("text", ["? [a, b]\n: 1\nc: 2\n", "? {a: 1}\n: 1\nc: 2\n", "? !!str [a]\n: 1\nc: 2\n"])
def test_a_key_that_is_a_collection_is_still_plain_yaml_error(text):
    """The duplicate check looks at keys before PyYAML does: a list or mapping as a key (which no
    manifest has) must still give PyYAML's own error, not a crash."""
    with pytest.raises(LoadError) as err:
        load_text(text, "k.yaml")
    assert str(err.value).startswith("k.yaml:1: invalid YAML: ")


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(st.sampled_from(["a", "'a'", '"a"', "1", "'1'", "yes", "true", "~", "? [x]", "? {y: 1}", "<<",
                                 "? !!str [z]", "!!str b", "&k a", "*k", "[a, b]", "{}"]), min_size=1, max_size=5),
       st.sampled_from(["", "  "]))
def test_any_keys_give_objects_or_a_load_error_never_a_crash(keys, indent):
    """Keys of every sort, repeated or not, in a block mapping: read, or a LoadError; for a key
    text given twice among plain string keys, the duplicate error."""
    text = "m:\n" + "".join(f"  {indent}{k}{'' if k.startswith('?') else ':'} {i}\n" if not k.startswith("?")
                            else f"  {indent}{k}\n  {indent}: {i}\n" for i, k in enumerate(keys))
    try:
        load_text(text, "k.yaml")
    except LoadError as exc:
        assert str(exc).startswith("k.yaml:"), str(exc)
    scalars = {"a", "'a'", '"a"', "1", "'1'", "yes", "true", "~", "!!str b"}
    if set(keys) <= scalars and sum(k in ("a", "'a'", '"a"') for k in keys) > 1:
        with pytest.raises(LoadError, match='duplicate key "'):  # (another pair may come first)
            load_text(text, "k.yaml")
