"""The fast YAML path reads every input exactly as PyYAML's safe loader does, or declines.

`yamlfast.load_all` returns None for text it cannot promise to read alike; load.py then uses
PyYAML. Whenever it does answer, its objects must equal PyYAML's in type as well as value (1,
1.0 and True are different things to a policy merge), key order included, and PyYAML must not
have refused the text. The inputs: every YAML file of the shared material and the examples,
synthetic clusters, mutated manifests dumped in every style PyYAML writes, and text built from
the corners of YAML 1.1's scalars.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwpolicy import load as load_module
from gwpolicy import yamlfast
from gwpolicy.bench.generate import cluster
from gwpolicy.load import LoadError, load_text
from helpers import ROOT, SHARED, needs_shared
from test_mutations import BASES, REPLACEMENTS, mutate

Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
Strict = load_module._Loader  # PyYAML's safe loader, refusing duplicate keys as kubectl does


def same(a: Any, b: Any) -> bool:
    """Equal in value and in type, all the way down (dict keys in the same order)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(k1, k2) and same(a[k1], b[k2]) for k1, k2 in zip(a, b))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return a == b


def check(text: str) -> list[Any] | None:
    """The fast reading of `text`, after checking that it is PyYAML's (or that it declined).

    PyYAML here is the reader of record (load.py's), which also refuses a duplicate key: the fast
    path must decline every text that one refuses. And the scan of distinct lines must answer as
    the same checks on the whole text do."""
    whole = "\n" + text + ("" if text.endswith("\n") else "\n")
    assert yamlfast.risky(text) == yamlfast._risky_lines(whole), text
    fast = yamlfast.load_all(text)
    if fast is None:
        return None
    try:
        slow = list(yaml.load_all(text, Loader=Strict))
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise AssertionError(f"the fast path read text that PyYAML refuses ({exc}):\n{text}") from None
    assert same(fast, slow), f"fast path differs from PyYAML:\n{text}\nfast: {fast!r}\nslow: {slow!r}"
    return fast


def _yaml_files() -> list[Path]:
    roots = [SHARED, ROOT / "examples", ROOT / "tests"]
    return sorted(p for r in roots if r.is_dir() for p in r.rglob("*") if p.suffix in (".yaml", ".yml"))


FILES = _yaml_files()


@needs_shared
def test_every_yaml_file_of_the_shared_material_and_examples_reads_alike():
    assert len(FILES) > 100
    answered = sum(check(p.read_text(encoding="utf-8")) is not None for p in FILES)
    assert answered > len(FILES) // 4  # the fast path is not declining everything


@pytest.mark.parametrize("routes,seed", [(3, 1), (25, 2), (60, 7)])
def test_synthetic_clusters_take_the_fast_path_and_read_alike(routes, seed):
    text = yaml.dump_all(cluster(routes, seed), Dumper=yaml.SafeDumper, sort_keys=False, default_flow_style=False)
    assert check(text) is not None


#: how PyYAML can write the same objects: quoting, flow or block, line width, unicode
STYLES = st.fixed_dictionaries({
    "default_style": st.sampled_from([None, None, '"', "'", "|"]),
    "default_flow_style": st.sampled_from([False, None, True]),
    "width": st.sampled_from([20, 80, 1000]),
    "allow_unicode": st.booleans(),
    "explicit_start": st.booleans(),
    "indent": st.sampled_from([2, 4]),
})


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(BASES), choice=st.integers(0, 10_000), op=st.integers(0, 4),
       replacement=st.sampled_from(REPLACEMENTS), style=STYLES)
def test_mutated_manifests_in_every_style_read_alike(base, choice, op, replacement, style):
    objs = list(base[1])
    index = choice % len(objs)
    objs[index] = mutate(objs[index], choice // len(objs), op, replacement)
    check(yaml.dump_all(objs, Dumper=yaml.SafeDumper, sort_keys=False, **style))


#: the corners of YAML 1.1 scalars (and of rapidyaml's), as they appear unquoted in a manifest
TOKENS = [
    "yes", "No", "ON", "off", "y", "n", "True", "TRUE", "false", "null", "Null", "~", "=", "<<",
    "0", "-0", "00", "012", "0o17", "0x1F", "0b101", "1_000", "+12", "-1", "1.5", "1.", ".5", "-.5",
    "1e3", "1E3", "1.5e3", "1.5e+3", "1.0e-3", "1e400", "1:20", "190:20:30.15", ".inf", "-.Inf", "inf",
    "nan", ".NaN", "2024-01-31", "2024-01-31T12:00:00Z", "2001-12-14 21:59:43.10 -5", "2024-1-1",
    "15s", "1.2.3", "10.0.0.1", "2001:db8::1", "0.5Gi", "100m", "a:b", "a: b", "a #b", "#x", "-", "--",
    "x", "hello world", "'q'", '"d"', "'it''s'", '"tab\\tnew\\nline"', '"\\u00e9\\x41"', '"\\\\"',
    "{}", "[]", "[1, no]", "{a: 1}", "{a:1}", "[a:b]", "&a x", "*a", "!!str 1", "? x", "|", ">",
    "|-", "|+", "|2", ">-", "é", "日本", "\t", "a\tb", "%", "...", "---", "12345678901234567890123",
    "9223372036854775807", "-9223372036854775808", "18446744073709551616",
    "@x", "`x", "]x", "}", "%x", ":x", ": x", "[:x]", "{a: :x}", "[%x]", "{a: x # y}", "a : b",
    '"a\n  b": 1', "'a\n  b': 1", "[false: 1]", "{null: 1}", "[plain\n  more: 1]", "[a,\n  b]",
]


#: what most of a manifest is made of: names, quoted text, the numbers and words both read alike
BENIGN = ["web", "0", "80", "-3", "1.5", "true", "false", "null", "''", "'yes'", '"1e3"', "'2024-01-31'",
          "15s", "route-1", "a b c", "x.y/z", "nginx:1.25.3", "'*'", '"a \\"b\\""', "{}", "[]", "- x", "é"]
BENIGN_KEYS = ["a", "spec", "x-y", "name", "'1'", '"true"', "metadata", "app.kubernetes.io/name"]


def _block(draw, indent: str, depth: int) -> list[str]:
    """A block mapping or sequence at `indent`, its values drawn from the benign and corner tokens."""
    benign = st.sampled_from(BENIGN)
    value = st.one_of(benign, benign, benign, benign, benign, st.sampled_from(TOKENS + [""]))
    key = st.one_of(*[st.sampled_from(BENIGN_KEYS)] * 6, st.sampled_from(TOKENS))
    lines = []
    seq = draw(st.booleans())
    for _ in range(draw(st.integers(1, 4))):
        lead = f"{indent}- " if seq else f"{indent}{draw(key)}:"
        shape = draw(st.integers(0, 3)) if depth < 3 else 0
        if shape == 0:
            lines.append(f"{lead} {draw(value)}" if not seq else f"{lead}{draw(value)}")
        elif shape == 1:  # nested block
            lines.append(lead.rstrip())
            lines += _block(draw, indent + "  ", depth + 1)
        elif shape == 2:  # a literal block scalar
            lines.append(f"{lead} |" if not seq else f"{lead}|")
            lines += [f"{indent}  {draw(value)}" for _ in range(draw(st.integers(1, 3)))]
        else:  # a plain scalar continued on the next line
            first = draw(st.sampled_from(["web", "a b c", "route-1", "x.y/z"]))
            lines.append(f"{lead} {first}" if not seq else f"{lead}{first}")
            lines.append(f"{indent}  {draw(value)}")
    return lines


@st.composite
def manifests(draw) -> str:
    """Documents of keys, values, list items and block scalars made of benign and corner tokens."""
    docs = []
    for _ in range(draw(st.integers(1, 3))):
        docs.append("\n".join(_block(draw, "", 0)))
    seps = draw(st.sampled_from(["\n---\n", "\n--- # c\n", "\n\n---\n"]))
    return draw(st.sampled_from(["", "---\n", "# c\n"])) + seps.join(docs) + draw(st.sampled_from(["\n", "", "\n---\n", "\n\n"]))


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(manifests())
def test_text_made_of_yaml_corners_reads_alike_or_goes_to_pyyaml(text):
    check(text)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | st.text(max_size=12)
    | st.sampled_from(TOKENS),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6) | st.sampled_from(TOKENS), inner,
                                                               max_size=4),
    max_leaves=20), STYLES)
def test_any_object_pyyaml_writes_reads_back_alike(obj, style):
    check(yaml.dump(obj, Dumper=yaml.SafeDumper, **style))


def test_corner_tokens_unquoted_go_to_pyyaml_where_the_readers_differ():
    # each one is read differently by rapidyaml's JSON and by YAML 1.1: the fast path must decline
    for token in ["yes", "No", "True", "Null", "~", "012", "0x1F", "1_000", "1e3", "1.5e3", "1:20",
                  ".inf", "inf", "nan", "2024-01-31", "2024-01-31T12:00:00Z"]:
        assert yamlfast.load_all(f"kind: X\nvalue: {token}\n") is None, token
        assert yamlfast.load_all(f"kind: X\nvalue: '{token}'\n") == [{"kind": "X", "value": token}], token
    assert yamlfast.load_all("a: &x 1\nb: *x\n") is None
    assert yamlfast.load_all("1: a\n") is None  # PyYAML reads an integer key


def test_the_common_forms_take_the_fast_path():
    text = "a: 1\nb: -2\nc: 1.5\nd: true\ne: null\nf: x\ng: ''\nh:\n- 80\n- '80'\n---\n"
    assert yamlfast.load_all(text) == [{"a": 1, "b": -2, "c": 1.5, "d": True, "e": None, "f": "x", "g": "",
                                        "h": [80, "80"]}, None]
    assert yamlfast.load_all("# only a comment\n") == []


def _big(text: str) -> str:
    """`text` after enough harmless documents that load.py takes the fast path."""
    filler = "".join(f"---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c{i}\n  namespace: n\n"
                     f"data:\n  k: v{i}\n" for i in range(1500))
    return filler + text


@pytest.mark.parametrize("bad", ["  labels: [a\n", "  labels:\n    a: 1\n   b: 2\n", "  labels: {a: 1\n"])
def test_a_big_file_with_a_yaml_error_names_file_and_line_and_nothing_else(bad, capfd, monkeypatch):
    text = _big("---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bad\n" + bad)
    line = text.count("\n", 0, text.index(bad)) + 1
    with pytest.raises(LoadError) as err:
        load_text(text, "big.yaml")
    message = str(err.value)
    assert message.startswith(("big.yaml:" + str(line) + ":", "big.yaml:" + str(line + 1) + ":", "big.yaml:" + str(line + 2) + ":"))
    assert capfd.readouterr().err == ""  # rapidyaml's own message is not shown
    monkeypatch.setattr(yamlfast, "load_all", lambda text: None)
    with pytest.raises(LoadError) as slow:
        load_text(text, "big.yaml")
    assert str(slow.value) == message  # the error PyYAML alone gives


def _readable(token: str) -> bool:
    try:
        yaml.load(f"v: {token}\n", Loader=Loader)
    except yaml.YAMLError:
        return False
    return True


READABLE = [t for t in TOKENS if _readable(t)]


def test_a_big_file_reads_as_pyyaml_reads_it():
    rng = random.Random(5)
    tail = "".join(f"---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x{i}\n"
                   f"data:\n  v: {rng.choice(READABLE)}\n" for i in range(50))
    for text in (_big(""), _big(tail)):
        fast = load_text(text, "big.yaml")
        assert len(text) >= 64 * 1024
        slow_docs = [d for d in yaml.load_all(text, Loader=Loader) if d is not None]
        assert same(fast.objects, slow_docs)


def test_the_benchmark_puts_effective_beside_both_parsers(tmp_path, capsys):
    from gwpolicy.bench.run import main as bench

    assert bench(["run", "--sizes", "20", "--repeat", "1", "--workdir", str(tmp_path),
                  "--json", str(tmp_path / "f.json")]) == 0
    import json

    row = json.loads((tmp_path / "f.json").read_text())["engine"][0]
    assert 0 < row["fastest_parse_s"] and 0 < row["parse_s"] and row["objects"] > 20
    assert abs(row["ratio_to_fastest"] - row["effective_s"] / row["fastest_parse_s"]) < 1e-9
    assert "x fastest" in capsys.readouterr().out


def test_the_command_line_on_a_big_cluster_gives_what_pyyaml_alone_gives(tmp_path, monkeypatch):
    """End to end through the console script (fast path, and its exit without teardown) against
    the same command in process with the fast path switched off."""
    import os
    import subprocess
    import sys

    from gwpolicy.bench.generate import write_yaml
    from helpers import run_cli

    path = tmp_path / "cluster.yaml"
    write_yaml(120, str(path))
    assert path.stat().st_size >= 64 * 1024 and yamlfast.load_all(path.read_text()) is not None
    script = os.path.join(os.path.dirname(sys.executable), "gwpolicy")
    for cmd in (["effective", "-o", "json"], ["status", "-o", "json"]):
        fast = subprocess.run([script, *cmd, "-f", str(path), "--now", "2026-01-01T00:00:00Z"],
                              capture_output=True, text=True, timeout=120)
        assert fast.returncode == 0, fast.stderr
        with monkeypatch.context() as m:
            m.setattr(yamlfast, "load_all", lambda text: None)
            slow = run_cli(*cmd, "-f", str(path), "--now", "2026-01-01T00:00:00Z")
        assert slow.code == 0
        assert fast.stdout == slow.out and fast.stderr == slow.err


SMALL_FILES = [p for p in FILES if "seeds" in p.parts or "parable" in p.parts][:24]
EDIT_CHARS = " \n:-'\"#[]{},|>&*!?x1.\\"


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.sampled_from(SMALL_FILES),
       st.lists(st.tuples(st.integers(0, 4), st.integers(0, 10_000), st.integers(0, 200), st.sampled_from(EDIT_CHARS)),
                min_size=1, max_size=3))
def test_real_manifests_with_characters_edited_read_alike_or_go_to_pyyaml(path, edits):
    """Broken indentation, stray indicators, cut lines: where rapidyaml is more lenient than PyYAML,
    the fast path must decline (PyYAML then reports the error)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    for op, line, pos, char in edits:
        j = line % len(lines)
        k = pos % (len(lines[j]) + 1)
        if op == 0:
            lines[j] = lines[j][:k] + lines[j][k + 1:]
        elif op == 1:
            lines[j] = lines[j][:k] + char + lines[j][k:]
        elif op == 2:
            lines.insert(j, lines[j])
        elif op == 3:
            lines[j] = " " + lines[j]
        else:
            lines[j] = lines[j][1:]
    check("\n".join(lines))


#: texts that rapidyaml read (or read differently) where PyYAML refuses them, found by comparing
#: the two readers on generated text: each was read by an earlier version of the scan
FOUND = ["k: @x\n", "- `x\n", "k: [%x]\n", "k: {a: x # y}\n", "k: [:x]\n", "- : x\n", "k: ]x\n", "}x: 1\n",
         " : 1\n", '- "a\n  b": 1\n', "k: 'a\n  b': 1\n", "k: [false: 1]\n", "k: {null: 1}\n",
         "k: [plain\n  more: 1]\n", "'q'!x\n", "[]!x\n", "|\nx=1E3\n", "--- >\nx\n", "- - x1.5\n  ...\n"]


@pytest.mark.parametrize("text", FOUND)
def test_what_rapidyaml_reads_and_pyyaml_does_not_goes_to_pyyaml(text):
    assert yamlfast.load_all(text) is None
    check(text)
