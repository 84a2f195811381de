"""kubectl conventions users reach for: names, selectors, printers, help, completion, CI gate.

Where kubectl itself can answer, the test asks it: the same objects go into `gwpolicy sandbox`, and
real kubectl's output is the expected one.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import NOW, ROOT, run_cli, write_manifests

PARABLE = str(ROOT / "examples" / "parable")
BIN = Path(sys.executable).parent


def gw(*args: str):
    return run_cli(*args, "-f", PARABLE, "--now", NOW)


def _svc(name: str, labels: dict | None, created: str, ports: list[dict]) -> dict:
    meta: dict = {"name": name, "namespace": "x", "creationTimestamp": created}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": {"ports": ports}}


SERVICES = [
    _svc("web-10", {"app": "web", "tier": "fe", "gwpolicy.io/team": "a"}, "2025-01-03T00:00:00Z",
         [{"name": "http", "port": 80}, {"name": "https", "port": 443}]),
    _svc("web-9", {"app": "web"}, "2025-01-01T00:00:00Z", [{"name": "http", "port": 8080}]),
    _svc("db", {"app": "db", "tier": "be"}, "2025-01-02T00:00:00Z", [{"port": 5432}]),
    _svc("plain", None, "2025-01-04T00:00:00Z", [{"port": 1}]),
]


@pytest.fixture(scope="module")
def services(tmp_path_factory) -> str:
    return str(write_manifests(tmp_path_factory.mktemp("services"), SERVICES, "services.yaml"))


@pytest.fixture(scope="module")
def services_as_stored(tmp_path_factory) -> str:
    """SERVICES with kube-apiserver's defaults and a cluster IP of the sandbox's range written out
    (the sandbox adds them as it does), so that what kubectl reads back from the sandbox is what
    the file says."""
    stored = copy.deepcopy(SERVICES)
    for i, s in enumerate(stored):
        ip = f"10.96.0.{100 + i}"
        s["spec"].update(type="ClusterIP", sessionAffinity="None", internalTrafficPolicy="Cluster", clusterIP=ip,
                         clusterIPs=[ip], ipFamilies=["IPv4"], ipFamilyPolicy="SingleStack")
        s["spec"]["ports"] = [{"protocol": "TCP", "targetPort": p["port"], **p} for p in s["spec"]["ports"]]
    return str(write_manifests(tmp_path_factory.mktemp("stored"), stored, "services.yaml"))


def svc(services: str, *args: str):
    return run_cli("get", "svc", "-n", "x", "-f", services, "--now", NOW, *args)


# ---------------------------------------------------------------- several names, missing names, empty lists


def test_several_names_of_one_type_print_in_the_order_given():
    run = gw("get", "retrypolicies", "cake-retries", "bagel-retries", "-n", "baker", "-o", "name")
    assert (run.code, run.err) == (0, "")
    assert run.out == "retrypolicy.policy.acme.io/cake-retries\nretrypolicy.policy.acme.io/bagel-retries\n"


def test_type_slash_name_of_several_types_prints_a_table_per_type_with_qualified_names():
    run = gw("get", "httproute/cake", "retrypolicy/cake-retries", "-n", "baker")
    assert run.code == 0, run.err
    tables = run.out.split("\n\n")
    assert len(tables) == 2
    assert tables[0].splitlines()[1].split()[0] == "httproute.gateway.networking.k8s.io/cake"
    assert tables[1].splitlines()[1].split()[0] == "retrypolicy.policy.acme.io/cake-retries"


def test_names_may_follow_the_flags_as_in_kubectl():
    assert gw("get", "httproutes", "-n", "baker", "cake", "bread", "-o", "name").out == \
        "httproute.gateway.networking.k8s.io/cake\nhttproute.gateway.networking.k8s.io/bread\n"
    described = gw("describe", "svc", "-n", "baker", "cake")
    assert described.code == 0 and described.out.startswith("Name:      cake\nNamespace: baker\n")
    explained = gw("explain", "httproute/cake", "-n", "baker", "maxRetries")
    assert explained.code == 0 and "maxRetries" in explained.out


def test_a_missing_name_is_an_error_and_the_other_names_still_print():
    run = gw("get", "retrypolicies", "cake-retries", "nope", "bagel-retries", "-n", "baker", "-o", "name")
    assert run.code == 1
    assert run.out == "retrypolicy.policy.acme.io/cake-retries\nretrypolicy.policy.acme.io/bagel-retries\n"
    assert run.err == 'Error: retrypolicies "nope" not found\n'
    run = gw("get", "httproute/nope", "httproute/cake", "-n", "baker", "-o", "name")
    assert (run.code, run.out, run.err) == (1, "httproute.gateway.networking.k8s.io/cake\n",
                                           'Error: httproutes "nope" not found\n')


def test_ignore_not_found():
    run = gw("get", "httproutes", "nope", "cake", "-n", "baker", "-o", "name", "--ignore-not-found")
    assert (run.code, run.out, run.err) == (0, "httproute.gateway.networking.k8s.io/cake\n", "")
    run = gw("get", "httproute/nope", "-n", "baker", "--ignore-not-found")
    assert (run.code, run.out, run.err) == (0, "", "")


def test_only_missing_names_print_nothing_but_the_errors_even_as_json():
    run = gw("get", "httproutes", "nope", "nada", "-n", "baker", "-o", "json")
    assert (run.code, run.out) == (1, "")
    assert run.err == 'Error: httproutes "nope" not found\nError: httproutes "nada" not found\n'


def test_one_name_as_json_is_the_object_itself_several_are_a_list():
    one = gw("get", "httproute", "cake", "-n", "baker", "-o", "json").json()
    assert (one["kind"], one["metadata"]["name"]) == ("HTTPRoute", "cake")
    two = gw("get", "httproute", "cake", "bread", "-n", "baker", "-o", "json").json()
    assert two["kind"] == "List" and [i["metadata"]["name"] for i in two["items"]] == ["cake", "bread"]


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_an_empty_list_is_kubectls_empty_list(fmt):
    run = gw("get", "policies", "-n", "nobody-here", "-o", fmt)
    assert (run.code, run.err) == (0, "")
    doc = json.loads(run.out) if fmt == "json" else yaml.safe_load(run.out)
    assert doc == {"apiVersion": "v1", "items": [], "kind": "List", "metadata": {"resourceVersion": ""}}
    assert gw("get", "policies", "-n", "nobody-here", "-o", "jsonpath={.items}").out == "[]"


def test_names_and_a_selector_do_not_mix():
    run = gw("get", "httproutes", "cake", "-l", "a=b", "-n", "baker")
    assert run.code == 1 and run.err == "Error: name cannot be provided when a selector is specified\n"


# ---------------------------------------------------------------- printing flags


def test_selector_operators(services):
    def names(sel: str) -> list[str]:
        run = svc(services, "-l", sel, "-o", "name")
        assert run.code == 0, run.err
        return [line.split("/", 1)[1] for line in run.out.splitlines()]

    assert names("app=web") == names("app==web") == ["web-10", "web-9"]
    assert names("app!=web") == ["db", "plain"]  # != also matches objects without the key
    assert names("tier in (fe,be)") == ["db", "web-10"]
    assert names("tier notin (fe)") == ["db", "plain", "web-9"]
    assert names("tier") == ["db", "web-10"]
    assert names("!tier") == ["plain", "web-9"]
    assert names("app=web,!tier") == ["web-9"]
    assert names("gwpolicy.io/team=a") == ["web-10"]
    assert names("app=nothing") == []


@pytest.mark.parametrize("bad", ["app in (a", "app=(x)", "bad key!", "a=b,", "=x", "app in ()", "a=b=c", "x/y/z"])
def test_a_bad_selector_is_a_clear_error(services, bad):
    run = svc(services, "-l", bad)
    assert run.code == 1 and run.out == ""
    assert run.err.startswith(f"Error: -l/--selector {bad!r}: ") and "Traceback" not in run.err


def test_show_labels_sort_by_and_no_headers(services):
    run = svc(services, "--show-labels", "--sort-by", ".metadata.creationTimestamp")
    lines = run.out.splitlines()
    assert lines[0].split() == ["NAME", "POLICIES", "AGE", "LABELS"]
    assert [line.split()[0] for line in lines[1:]] == ["web-9", "db", "web-10", "plain"]
    assert lines[1].split()[-1] == "app=web" and lines[-1].split()[-1] == "<none>"
    assert lines[3].split()[-1] == "app=web,gwpolicy.io/team=a,tier=fe"  # sorted by key, as kubectl
    headless = svc(services, "--no-headers", "--sort-by", "{.spec.ports[0].port}")
    assert [line.split()[0] for line in headless.out.splitlines()] == ["plain", "web-10", "db", "web-9"]
    assert "NAME" not in headless.out
    missing_first = svc(services, "--sort-by", ".metadata.labels.tier", "-o", "name")
    assert missing_first.out.splitlines()[:2] == ["service/plain", "service/web-9"]


def test_show_labels_is_for_tables_only(services):
    run = svc(services, "--show-labels", "-o", "name")
    assert (run.code, run.err) == (1, "Error: --show-labels option cannot be used with name printer\n")


def test_jsonpath_and_custom_columns(services):
    run = svc(services, "-o", 'jsonpath={range .items[*]}{.metadata.name}:{.spec.ports[?(@.name=="http")].port}{"\\n"}{end}')
    assert run.out == "db:\nplain:\nweb-10:80\nweb-9:8080\n"
    assert svc(services, "-o", "jsonpath={.items[*].metadata.labels.gwpolicy\\.io/team}").out == "a"
    assert svc(services, "-o", "jsonpath={.items[2].spec.ports}").out == \
        '[{"name":"http","port":80},{"name":"https","port":443}]'
    cols = svc(services, "-o", "custom-columns=NAME:.metadata.name,PORTS:.spec.ports[*].port,TIER:metadata.labels.tier")
    assert cols.out.splitlines() == ["NAME     PORTS    TIER", "db       5432     be", "plain    1        <none>",
                                     "web-10   80,443   fe", "web-9    8080     <none>"]


@pytest.mark.parametrize("args, message", [
    (["-o", "jsonpath={.items[0]"], "Error: -o jsonpath: unclosed action"),
    (["-o", "jsonpath={range .items[*]}{.a}"], "Error: -o jsonpath: {range} without {end}"),
    (["-o", "jsonpath={.a[?(@.x==)]}"], "Error: -o jsonpath: cannot parse"),
    (["-o", "custom-columns=NAME"], "Error: -o custom-columns: unexpected custom-columns spec 'NAME'"),
    (["--sort-by", ".a[0"], "Error: --sort-by: unclosed '['"),
])
def test_bad_templates_are_refused_before_any_output(services, args, message):
    run = svc(services, *args)
    assert run.code == 1 and run.out == ""
    assert run.err.startswith(message), run.err


def test_an_unknown_output_format_names_the_formats():
    run = gw("get", "policies", "-o", "foo")
    assert run.code == 1
    assert 'unable to match a printer suitable for the output format "foo", allowed formats are: ' \
           "table,wide,json,yaml,name,jsonpath=TEMPLATE,custom-columns=SPEC" in run.err


@pytest.fixture
def sandbox(tmp_path):
    from sandbox_proc import SandboxProcess

    sb = SandboxProcess(tmp_path, "--keep-creation-timestamp")
    try:
        yield sb
    finally:
        sb.close()


KUBECTL_CASES = [
    ["-o", "name"],
    ["-o", "name", "--sort-by", ".metadata.name"],
    ["-o", "name", "--sort-by", "{.spec.ports[0].port}"],
    ["-o", "name", "--sort-by", ".metadata.creationTimestamp"],
    ["-o", "name", "-l", "app!=web"],
    ["-o", "name", "-l", "tier notin (fe),app"],
    ["-o", "name", "-l", "!tier"],
    ["-o", "custom-columns=N:.metadata.name,P:.spec.ports[*].port,L:.metadata.labels,Q:.spec.ports[0],X:.nope"],
    ["-o", "custom-columns=N:.metadata.name", "--no-headers"],
    ["-o", 'jsonpath={range.items[*]}{.metadata.name}:{.spec.ports[?(@.name=="http")].port}{"\\n"}{end}'],
    ["-o", "jsonpath={..port}"],
    ["-o", "jsonpath={.items[*].spec.ports[-1:].port}"],
    ["-o", "jsonpath={.items[?(@.metadata.labels.tier)].metadata.name}"],
    ["-o", "jsonpath={.items[0].metadata.labels}"],
    ["-o", "jsonpath={.items[*].metadata.labels.gwpolicy\\.io/team}"],
    ["-o", "jsonpath={.kind} {.items[0].spec.ports[0].port}"],
    ["-l", "app=nothing", "-o", "json"],
    ["-l", "app=nothing", "-o", "yaml"],
    ["web-9", "-o", "jsonpath={.metadata.name}"],
    ["web-9", "nope", "db", "-o", "name"],
    ["--show-labels", "-o", "name"],
    ["web-9", "-o", "json"],
    ["web-9", "nope", "-o", "yaml"],
    ["-o", "jsonpath={@.kind} {$.kind} {.items[1:3].metadata.name} {.items[*].spec.ports[*].name}"],
    ["-o", "jsonpath={range .items[*]}{.metadata.name}{'\\n'}{end}"],
    ["-o", "custom-columns=NAME:{.metadata.name},APP:{.metadata.labels.app}", "--sort-by", ".metadata.labels.app"],
    ["-o", "name", "-l", "app in (web,db),tier!=fe"],
    ["nope", "db", "--ignore-not-found", "-o", "name"],
    ["nope", "--ignore-not-found"],
    ["-o", "custom-columns=NAME"],
    ["-o", "jsonpath={.items[0]"],
]


def _without_server_fields(doc):
    """A document as the input wrote it: what the API server adds (uid, resourceVersion...) goes."""
    for obj in (doc.get("items") or [doc]) if isinstance(doc, dict) and doc.get("kind") == "List" else [doc]:
        if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict):
            for key in ("annotations", "uid", "resourceVersion", "generation", "managedFields"):
                obj["metadata"].pop(key, None)
    return doc


def test_printing_matches_real_kubectl(sandbox, services_as_stored):
    """The same Services in the sandbox: kubectl's output is what gwpolicy must print."""
    services = services_as_stored
    sandbox.kubectl("create", "namespace", "x")
    sandbox.kubectl("apply", "-f", services)
    mismatches = []
    for case in KUBECTL_CASES:
        want = sandbox.kubectl("get", "svc", "-n", "x", *case, check=False)
        got = svc(services, *case)
        parse = {"json": json.loads, "yaml": yaml.safe_load}.get(case[-1])  # indentation is gwpolicy's own
        as_doc = (lambda text, parse=parse: _without_server_fields(parse(text) if text else None)) if parse else None
        if as_doc is not None and (as_doc(got.out), got.code) != (as_doc(want.stdout), want.returncode):
            mismatches.append((case, want.stdout, got.out))
        elif as_doc is None and (got.out, got.code) != (want.stdout, want.returncode):
            mismatches.append((case, want.stdout, want.returncode, got.out, got.code))
        # errors: the same words after the prefix (kubectl says `error:` or `Error from server (NotFound):`)
        w_err = [re.sub(r"^(error|Error from server \(NotFound\)): ", "", line) for line in want.stderr.splitlines()]
        g_err = [re.sub(r"^Error: (-o [a-z-]+: )?", "", line) for line in got.err.splitlines()]
        if bool(w_err) != bool(g_err) or (w_err and "not found" in w_err[0] and w_err != g_err):
            mismatches.append((case, want.stderr, got.err))
    assert not mismatches, "\n".join(map(repr, mismatches))


# ---------------------------------------------------------------- selector rules for every input


_key = st.sampled_from(["app", "tier", "gwpolicy.io/team", "x"])
_val = st.sampled_from(["a", "b", "web", "1", ""])
_labels = st.dictionaries(_key, _val, max_size=4)
_req = st.one_of(
    st.tuples(_key, st.sampled_from(["=", "==", "!="]), _val),
    st.tuples(_key, st.sampled_from(["in", "notin"]),
              st.lists(_val, min_size=1, max_size=3).filter(lambda v: v != [""])),  # `in ()` is refused
    st.tuples(_key, st.sampled_from(["exists", "!"]), st.none()),
)


def _text(req) -> str:
    key, op, v = req
    if op in ("in", "notin"):
        return f"{key} {op} ({','.join(v)})"
    if op == "exists":
        return key
    if op == "!":
        return f"!{key}"
    return f"{key}{op}{v}"


def _model(req, labels) -> bool:
    key, op, v = req
    if op in ("=", "=="):
        return labels.get(key) == v
    if op == "!=":
        return labels.get(key) != v
    if op == "in":
        return key in labels and labels[key] in v
    if op == "notin":
        return labels.get(key) not in v
    return (key in labels) == (op == "exists")


@settings(max_examples=300, deadline=None)
@given(st.lists(_req, min_size=1, max_size=4), _labels)
def test_a_selector_is_the_and_of_its_requirements(reqs, labels):
    from gwpolicy.cli.selector import parse_selector

    sel = parse_selector(",".join(_text(r) for r in reqs))
    assert sel.matches(labels) == all(_model(r, labels) for r in reqs)


_field = st.text("abcXYZ019._/-", min_size=1, max_size=6)
_leaf = st.one_of(st.text(max_size=5), st.integers(-5, 5), st.booleans(), st.none(), st.lists(st.integers(0, 3), max_size=2))
_doc = st.recursive(_leaf, lambda kids: st.dictionaries(_field, kids, min_size=1, max_size=3), max_leaves=8)


def _paths(doc, prefix=()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield prefix + (k,), v
            yield from _paths(v, prefix + (k,))


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_field, _doc, min_size=1, max_size=3))
def test_every_field_is_reached_by_its_escaped_kubectl_path(doc):
    """Whatever a field is called (dots, slashes, digits), `{.a.b\\.c}` prints its value as kubectl does."""
    from gwpolicy.cli.jsonpath import parse_template, text_of

    for path, value in _paths(doc):
        template = "{" + "".join("." + k.replace(".", "\\.") for k in path) + "}"
        assert parse_template(template).render(doc) == text_of(value), template


def test_a_filter_comparing_a_number_with_a_string_is_false(services):
    """RFC 9535, as jsonpath-ng evaluates it (kubectl calls it an error; docs/cli.md says so)."""
    run = svc(services, "-o", 'jsonpath={.items[*].spec.ports[?(@.port > "a")].name}')
    assert (run.code, run.out, run.err) == (0, "", "")
    assert svc(services, "-o", 'jsonpath={.items[*].spec.ports[?(@.port > 443)].name}').out == "http"


_selector_text = st.text("ab=!,() in notin/.-_x1", max_size=24)
_template_text = st.text("{}[]()?@$.*:'\"\\ab=<>!,-0123 range end", max_size=30)


@settings(max_examples=150, deadline=None)
@given(_selector_text, _template_text, st.sampled_from(["jsonpath=", "custom-columns=", "sort"]))
def test_any_selector_or_template_is_printed_or_refused_never_a_crash(services, selector, template, where):
    """Whatever is typed after -l, -o jsonpath=, -o custom-columns= or --sort-by: output, or `Error:`."""
    flags = ["--sort-by", template or "."] if where == "sort" else ["-o", where + template]
    run = svc(services, "-l", selector, *flags) if selector.strip() else svc(services, *flags)
    assert "Error: unexpected " not in run.err and "Traceback" not in run.err, (selector, template, run.err)
    assert run.code == 0 or run.err.startswith(("Error: ", "usage: ")), (selector, template, run.err)


# ---------------------------------------------------------------- one reference format everywhere


NAMESPACED = ("HTTPRoute", "Gateway", "Service", "RetryPolicy", "TimeoutPolicy", "HealthCheckPolicy")


@pytest.mark.parametrize("args", [
    ["get", "policies", "-n", "baker", "-o", "wide"],
    ["describe", "httproute/cake", "-n", "baker"],
    ["describe", "retrypolicy/baker-retries", "-n", "baker"],
    ["describe", "gateway/prod-web", "-n", "infra"],
    ["impact", "retrypolicy/cake-retries", "-n", "baker"],
    ["whatif", "--delete", "healthcheckpolicy/cake-health", "-n", "baker"],
    ["explain", "httproute/cake", "maxRetries", "-n", "baker"],
])
def test_every_printer_names_namespaced_objects_kind_namespace_name(args):
    run = gw(*args)
    assert run.code == 0, run.err
    refs = re.findall(r"\b(" + "|".join(NAMESPACED) + r")/([\w.-]+(?:/[\w.-]+)?)", run.out)
    assert refs
    short = sorted({f"{k}/{n}" for k, n in refs if "/" not in n})
    assert not short, f"references without their namespace: {short}"
    assert not re.search(r"\b(" + "|".join(NAMESPACED) + r") [a-z0-9-]+/[a-z0-9-]+ affects", run.out)


def _references(doc, key=None):
    """(key it sits under, reference) for every object reference of a gwpolicy JSON document."""
    if isinstance(doc, dict):
        if {"group", "kind", "name"} <= set(doc) and key != "status":
            yield key, doc
        for k, v in doc.items():
            if k not in ("status", "spec"):  # the objects' own fields are the input's, not ours
                yield from _references(v, k)
    elif isinstance(doc, list):
        for v in doc:
            yield from _references(v, key)


@pytest.mark.parametrize("args", [
    ["effective", "-n", "payments"],
    ["status", "-n", "baker"],
    ["explain", "httproute/cake#api", "backoff", "-n", "baker", "-o", "json"],
    ["impact", "retrypolicy/cake-retries", "-n", "baker", "-o", "json"],
    ["whatif", "--delete", "healthcheckpolicy/cake-health", "-n", "baker", "-o", "json"],
])
def test_every_json_reference_follows_one_rule(args):
    refs = list(_references(gw(*args).json()))
    assert refs
    for key, ref in refs:
        if key == "target":
            assert list(ref) == ["group", "kind", "namespace", "name", "sectionName"], (key, ref)
        else:
            assert set(ref) <= {"group", "kind", "namespace", "name", "sectionName"}, (key, ref)
            assert None not in (ref.get("namespace", ""), ref.get("sectionName", "")), (key, ref)


def test_breadcrumb_suggests_a_command_with_the_namespace():
    doc = gw("get", "gateway", "prod-web", "-n", "infra", "-o", "json").json()
    messages = [c["message"] for c in doc["status"]["conditions"] if c["type"].startswith("gwpolicy.io/")]
    assert messages and all("'gwpolicy describe gateway/prod-web -n infra'" in m for m in messages)
    route = gw("get", "httproute", "cake", "-n", "baker", "-o", "json").json()
    ours = [c["message"] for p in route["status"]["parents"] for c in p["conditions"] if c["type"].startswith("gwpolicy.io/")]
    assert ours and all("-n baker'" in m for m in ours)


# ---------------------------------------------------------------- KUBECONFIG with several files


def test_several_kubeconfig_files_merge_as_kubectl_merges_them(tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_text("apiVersion: v1\nkind: Config\ncurrent-context: b\n"
                     "contexts:\n- name: a\n  context: {cluster: c, namespace: grocer}\n")
    second.write_text("apiVersion: v1\nkind: Config\ncurrent-context: a\n"
                      "contexts:\n- name: b\n  context: {cluster: c, namespace: payments}\n"
                      "- name: a\n  context: {cluster: c, namespace: infra}\n")
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "missing"), str(first), str(second)]))
    # current-context from the first file that sets it (b, defined only in the second file)
    assert "checkout-tls" in gw("get", "policies").out
    # context a is taken from the first file that names it: grocer, not infra
    assert "grocer-timeouts" in gw("get", "policies", "--context", "a").out


def test_live_mode_reads_a_cluster_named_by_a_kubeconfig_list(sandbox, tmp_path, services):
    sandbox.kubectl("create", "namespace", "x")
    sandbox.kubectl("apply", "-f", services)
    env = dict(os.environ, KUBECONFIG=os.pathsep.join([str(tmp_path / "missing"), str(sandbox.kubeconfig)]))
    run = subprocess.run([str(BIN / "gwpolicy"), "get", "svc", "-n", "x", "-o", "name"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["service/db", "service/plain", "service/web-10", "service/web-9"]
    # without -f, completion reads names from the cluster, as kubectl's __complete does
    done = subprocess.run([str(BIN / "gwpolicy"), "__complete", "get", "svc", "-n", "x", "w"], capture_output=True,
                          text=True, env=env, timeout=60)
    assert done.stdout.splitlines() == ["web-10", "web-9", ":4"]


# ---------------------------------------------------------------- CI gate


def test_status_fail_on_not_accepted_gates_ci():
    run = gw("status", "-n", "baker", "--fail-on-not-accepted")
    assert run.code == 3
    assert run.json()["kind"] == "StatusList"  # the output still goes out
    assert run.err.startswith("Error: 3 policies are not Accepted:\n")
    lines = run.err.splitlines()[1:]
    assert [line.split(": ")[:2] for line in lines] == [
        ["  HealthCheckPolicy/baker/cake-health-v2", "Conflicted on Service/baker/cake"],
        ["  RetryPolicy/baker/cake-retries-again", "Conflicted on HTTPRoute/baker/cake"],
        ["  RetryPolicy/baker/typo", "TargetNotFound on HTTPRoute/baker/cakes"]]
    assert all(len(line.split(": ")) > 2 for line in lines)  # each with the engine's message: what to fix
    assert gw("status", "-n", "baker").code == 0  # without the flag: status only
    ok = gw("status", "-n", "payments", "--fail-on-not-accepted")
    assert (ok.code, ok.err) == (0, "")


# ---------------------------------------------------------------- help and usage


COMMANDS = ["get", "describe", "explain", "impact", "whatif", "graph", "effective", "status", "completion", "sandbox"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_examples_in_its_help(command):
    run = run_cli(command, "--help")
    assert run.code == 0
    assert "\nExamples:\n" in run.out and f"  gwpolicy {command} " in run.out
    if command not in ("completion",):
        assert "(default: " in run.out


def _example_lines() -> list[str]:
    from gwpolicy.cli.parser import EXAMPLES

    return [line.strip() for text in EXAMPLES.values() for line in text.format(p="gwpolicy").splitlines()
            if line.strip().startswith("gwpolicy ") and "-f examples/" in line
            and "--apply" not in line  # the edited file of `whatif --apply` is the reader's own
            and not line.endswith("&")]  # a server in the background


@pytest.mark.parametrize("line", _example_lines())
def test_the_examples_run(line, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = shlex.split(line.split(" > ")[0])[1:]
    run = run_cli(*args)
    assert run.code == 0, run.err


def test_a_bad_flag_shows_the_subcommands_own_usage():
    run = run_cli("get", "policies", "--bogus", "-f", PARABLE)
    assert run.code == 1 and run.out == ""
    assert run.err.startswith("usage: gwpolicy get ")
    assert "Error: unrecognized arguments: --bogus\nSee 'gwpolicy get --help' for usage and examples.\n" in run.err
    bad_choice = run_cli("explain", "httproute/cake", "x", "-o", "nope")
    assert bad_choice.code == 1 and bad_choice.err.startswith("usage: gwpolicy explain ")


def _kubectl_env(tmp_path) -> dict[str, str]:
    assert shutil.which("kubectl"), "kubectl is missing: it is part of the machine (Debian package kubectl)"
    return dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", KUBECONFIG=str(tmp_path / "none"))


def test_kubectl_gwpolicy_shows_its_own_name(tmp_path):
    env = _kubectl_env(tmp_path)
    help_ = subprocess.run(["kubectl", "gwpolicy", "get", "--help"], capture_output=True, text=True, env=env)
    assert help_.returncode == 0
    assert help_.stdout.startswith("usage: kubectl gwpolicy get ")
    assert "  kubectl gwpolicy get policies -n baker" in help_.stdout
    bad = subprocess.run(["kubectl", "gwpolicy", "describe", "--bogus"], capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and bad.stderr.startswith("usage: kubectl gwpolicy describe ")
    assert "See 'kubectl gwpolicy describe --help'" in bad.stderr
    top = subprocess.run(["kubectl", "gwpolicy"], capture_output=True, text=True, env=env)
    assert top.stderr.startswith("usage: kubectl gwpolicy ")


# ---------------------------------------------------------------- completion


def _complete(*words: str) -> tuple[list[str], str]:
    run = run_cli("__complete", *words)
    assert run.code == 0 and run.err == ""
    *lines, directive = run.out.splitlines()
    return lines, directive


def test_complete_commands_types_names_and_flag_values():
    commands, d = _complete("")
    assert {"get", "describe", "explain", "status", "completion"} <= set(commands) and d == ":4"
    g_words, _ = _complete("g")
    assert {"get", "graph"} <= set(g_words) and all(w.startswith("g") for w in g_words)
    types, _ = _complete("get", "-f", PARABLE, "")
    assert types[:2] == ["policies", "policykinds"] and {"httproutes", "retrypolicies", "gateways"} <= set(types)
    assert _complete("get", "-f", PARABLE, "-n", "baker", "httproutes", "c")[0] == ["cake", "cookies", "croissant"]
    assert _complete("get", "-f", PARABLE, "-n", "baker", "httproutes", "cake", "c")[0] == ["cookies", "croissant"]
    assert _complete("describe", "-f", PARABLE, "-n", "baker", "retrypolicy/cake-r")[0] == \
        ["retrypolicy/cake-retries", "retrypolicy/cake-retries-again"]
    assert "prod-web" in _complete("describe", "gateway", "-f", PARABLE, "-A", "")[0]
    assert _complete("get", "-f", PARABLE, "-n", "")[0] == ["baker", "grocer", "infra", "payments"]
    assert _complete("get", "-o", "j") == (["json", "jsonpath="], ":4")
    assert _complete("get", "-f", "") == ([], ":0")  # files: the shell completes them
    assert "--selector" in _complete("get", "--s")[0]
    assert _complete("completion", "") == (["bash", "zsh"], ":4")


def test_bash_completion_through_real_bash(tmp_path):
    script = run_cli("completion", "bash").out
    (tmp_path / "c.bash").write_text(script)
    line = f"gwpolicy get -f {PARABLE} -n baker httproutes c"
    probe = (f"source {tmp_path / 'c.bash'}; COMP_LINE={shlex.quote(line)}; COMP_POINT=${{#COMP_LINE}}; "
             "_gwpolicy_complete; printf '%s\\n' \"${COMPREPLY[@]}\"; complete -p gwpolicy")
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}")
    run = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["cake", "cookies", "croissant", "complete -F _gwpolicy_complete gwpolicy"]


def test_zsh_completion_through_real_zsh(tmp_path):
    if shutil.which("zsh") is None:
        pytest.fail("zsh is missing: ./dev test installs the Debian package zsh")
    script = run_cli("completion", "zsh").out
    (tmp_path / "_gwpolicy").write_text(script)
    # compadd only works inside a completion widget: record what it is given instead
    probe = (f"autoload -Uz compinit && compinit -u -D; source {tmp_path / '_gwpolicy'}; "
             "compadd() { local a; for a in \"$@\"; do [[ $a == -* ]] || print -r -- $a; done }; "
             f"words=(gwpolicy describe -f {PARABLE} -n baker retrypolicy/cake-r); CURRENT=${{#words}}; _gwpolicy; "
             "print -r -- defined:${+_comps[gwpolicy]}")
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", HOME=str(tmp_path))
    run = subprocess.run(["zsh", "-f", "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines == ["retrypolicy/cake-retries", "retrypolicy/cake-retries-again", "defined:1"], run.stdout


def test_kubectl_completes_the_plugin(tmp_path):
    """kubectl's own completion runs kubectl_complete-gwpolicy, as for any plugin."""
    env = _kubectl_env(tmp_path)
    run = subprocess.run(["kubectl", "__complete", "gwpolicy", "get", "-f", PARABLE, "-n", "baker", "httproutes", "c"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["cake", "cookies", "croissant", ":4"]
