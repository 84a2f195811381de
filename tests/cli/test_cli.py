"""The CLI as Ana and Charlie use it: kubectl conventions, the parable's questions, the kubectl plugin."""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import NOW, ROOT, run_cli

PARABLE = str(ROOT / "examples" / "parable")
BIN = Path(sys.executable).parent


def gw(*args: str):
    return run_cli(*args, "-f", PARABLE, "--now", NOW)


@pytest.mark.parametrize("spelling", ["httproute", "httproutes", "HTTPRoute", "httproutes.gateway.networking.k8s.io"])
def test_types_are_spelled_as_kubectl_accepts_them(spelling):
    run = gw("describe", f"{spelling}/cake", "-n", "baker")
    assert run.code == 0, run.err
    assert run.out.startswith("Name:      cake\nNamespace: baker\n")


def test_not_found_is_a_kubectl_error_with_exit_1():
    run = gw("describe", "httproute/x", "-n", "baker")
    assert (run.code, run.out, run.err) == (1, "", 'Error: httproutes "x" not found\n')
    run = gw("get", "frobnicators")
    assert run.code == 1 and run.err == 'Error: the server doesn\'t have a resource type "frobnicators"\n'


def test_no_resources_is_said_on_stderr_with_exit_0():
    run = gw("get", "policies", "-n", "nobody-here")
    assert (run.code, run.out, run.err) == (0, "", "No resources found in nobody-here namespace.\n")


def test_ana_sees_that_charlies_override_beats_her_default():
    # the parable: Ana's route default maxRetries 5 loses to the namespace-wide override of 1
    run = gw("explain", "httproute/cake", "maxRetries", "-n", "baker", "-o", "json")
    assert run.code == 0, run.err
    doc = run.json()
    for block in doc["paths"]:
        assert block["effective"] == {"maxRetries": 1}
        verdicts = {(c["policy"]["name"], c["verdict"]) for c in block["candidates"]}
        assert ("baker-retries", "effective") in verdicts
        assert ("cake-retries", "beaten") in verdicts
        assert ("cake-retries-again", "conflicted") in verdicts
        winner = next(c for c in block["candidates"] if c["verdict"] == "effective")
        assert "override above the target" in winner["why"]


def test_charlie_sees_the_blast_radius_of_the_namespace_policy():
    run = gw("impact", "retrypolicy/baker-retries", "-n", "baker", "-o", "json")
    doc = run.json()
    assert doc["policy"] == {"group": "policy.acme.io", "kind": "RetryPolicy", "namespace": "baker", "name": "baker-retries"}
    affected = {(r["kind"], r["name"]) for r in doc["affected"]}
    assert ("HTTPRoute", "cake") in affected and ("Namespace", "baker") in affected
    assert all(r.get("namespace", "baker") == "baker" for r in doc["affected"])
    cake = [c for c in doc["changes"] if c["target"]["name"] == "cake" and c["target"]["kind"] == "HTTPRoute"
            and c["target"]["sectionName"] is None and c["field"] == "maxRetries"]
    assert cake and all((c["before"], c["after"]) == (1, 5) for c in cake)  # Ana's default comes back
    assert set(doc) == {"policy", "affected", "changes"}


def test_whatif_shows_effective_and_status_changes_before_anyone_applies():
    run = gw("whatif", "--apply", str(ROOT / "tests" / "data" / "baker-retries-without-overrides.yaml"),
             "-n", "baker", "-o", "json")
    doc = run.json()
    cake = [c for c in doc["effective"] if c["target"]["name"] == "cake" and c["target"]["kind"] == "HTTPRoute"
            and c["target"]["sectionName"] is None and c["field"] == "maxRetries"]
    assert cake and all((c["before"], c["after"]) == (1, 5) for c in cake)
    run = gw("whatif", "--delete", "healthcheckpolicy/cake-health", "-n", "baker", "-o", "json")
    status = {(s["object"]["name"], (s["before"] or {}).get("reason"), (s["after"] or {}).get("reason"))
              for s in run.json()["status"] if "ancestor" in s}
    assert ("cake-health-v2", "Conflicted", "Accepted") in status
    assert ("cake-health", "Accepted", None) in status


def test_describe_policy_counts_what_it_affects_and_how_its_fields_fare():
    run = gw("describe", "retrypolicy/cake-retries", "-n", "baker")
    assert "Affects: 2 objects (1 HTTPRoute, 1 Service)" in run.out
    # maxRetries is beaten by the namespace override everywhere; retryOn survives
    assert "effective on 0 paths, partially on 14, overridden on 0" in run.out
    row = next(line.split() for line in run.out.splitlines()
               if line.strip().startswith("HTTPRoute/baker/cake ") and "partially" in line)
    assert row[2:] == ["partially", "retryOn", "maxRetries", "2"]


def test_get_policies_counts_affected_objects():
    run = gw("get", "policies", "-n", "baker")
    rows = {line.split()[0]: line.split() for line in run.out.splitlines()[1:]}
    assert rows["baker-retries"][4] == "25"
    assert rows["bagel-retries"][4] == "0"  # entirely overridden: Charlie's override wins
    assert rows["typo"][3] == "False"


def test_svg_graph_through_graphviz():
    if shutil.which("dot") is None:
        pytest.fail("Graphviz's dot is missing: ./dev test installs the Debian package graphviz")
    run = gw("graph", "-o", "svg", "-n", "payments")
    assert run.code == 0 and "<svg" in run.out


def _run_in_terminal(args: list[str]) -> str:
    main, sub = pty.openpty()
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}")
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(args, stdout=sub, stderr=sub, env=env)
    os.close(sub)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait()
    return b"".join(chunks).decode()


def test_colour_only_on_a_terminal():
    args = [str(BIN / "gwpolicy"), "describe", "httproute/cake", "-n", "baker", "-f", PARABLE, "--now", NOW]
    assert "\033[" in _run_in_terminal(args)
    piped = subprocess.run(args, capture_output=True, text=True, check=True)
    assert "\033[" not in piped.stdout


def test_kubectl_runs_the_plugin(tmp_path):
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is missing: it is part of the machine (Debian package kubectl)"
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", KUBECONFIG=str(tmp_path / "none"))
    listed = subprocess.run([kubectl, "plugin", "list"], capture_output=True, text=True, env=env)
    assert "kubectl-gwpolicy" in listed.stdout
    run = subprocess.run([kubectl, "gwpolicy", "describe", "httproute/cake", "-n", "baker", "-f", PARABLE, "--now", NOW],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout == gw("describe", "httproute/cake", "-n", "baker").out
    run = subprocess.run([kubectl, "gwpolicy", "get", "httproutes/nope", "-n", "baker", "-f", PARABLE],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 1 and run.stderr == 'Error: httproutes "nope" not found\n'


def test_context_namespace_comes_from_the_kubeconfig(tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text("apiVersion: v1\nkind: Config\ncurrent-context: a\ncontexts:\n"
                   "- name: a\n  context: {cluster: x, namespace: grocer}\n- name: b\n  context: {cluster: x, namespace: payments}\n")
    run = run_cli("get", "policies", "-f", PARABLE, "--kubeconfig", str(cfg), "--now", NOW)
    assert "grocer-timeouts" in run.out and "cake-retries" not in run.out
    run = run_cli("get", "policies", "-f", PARABLE, "--kubeconfig", str(cfg), "--context", "b", "--now", NOW)
    assert "checkout-tls" in run.out
