"""No text of an object becomes NGINX syntax, as a property (docs/security.md).

Random Gateways, HTTPRoutes (matches, every filter, backends, mirrors), a BackendTLSPolicy and
policies are rendered with NGINX's metacharacters (line break, `;`, `{`, `}`, `#`, `"`, `'`, `$`,
`\\`) and pieces of configuration in every string field, as `render -f` would read them from a
tenant's files (nothing validated them). Two checks:

- NGINX's own parser (`nginx -t`, Debian's NGINX, in a temporary prefix) loads the files, and no
  directive is named after the payloads' marker `gwinjected` (which NGINX would refuse as unknown);
- the structure does not change with the strings: the same objects rendered with each payload's
  metacharacters swapped for ones that gwpolicy treats alike but NGINX's syntax does not
  (`;` and `"`, `#` and `'`, LF and CR) give the same tree of directives (names, numbers of
  arguments, blocks; tests/nginx_conf.py reads the files as NGINX does). A character that
  reached the syntax unescaped would split a word, end a directive, open a string or end a
  comment in one rendering and not in the other.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nginx_conf
from gateway_kit import TEST_ENDPOINTS, backend, endpoints, gateway, gatewayclass, have_nginx, listener, meta, service
from gwpolicy.engine.analysis import analyse
from gwpolicy.engine.refs import GATEWAY_GROUP, Ref
from gwpolicy.gateway import policyconf
from gwpolicy.gateway.dataplane import DataPlaneConfig, build_dataplane
from gwpolicy.gateway.render import render
from test_gateway_policies import policy_manifests

POLICY_KINDS = policy_manifests()

ADDR = "127.0.73.1"
GW_REF = Ref(GATEWAY_GROUP, "Gateway", "infra", "gw")
MARK = "gwinjected"
MARKED = re.compile(rf"(?<![A-Za-z0-9_]){MARK}(?![A-Za-z0-9_])")

#: every metacharacter of NGINX's syntax; quote() refuses `$` and line breaks, so a field gets
#: either all of them or those a quoted string can hold
ALL = ["\n", ";", "{", "}", "#", '"', "'", "$", "\\"]
QUOTABLE = [";", "{", "}", "#", '"', "'", "\\"]
#: as ALL, each escaped as a regular expression: RegularExpression values that RE2 and PCRE2 take
REGEX = [";", "#", '"', "'", "\\{", "\\}", "\\\\", "\\$"]
PIECES = ["", "a", " ", MARK, f"{MARK} 1", f"return 200 {MARK}", "}} server { listen 1; ", "location ~ / { "]
LINE_PIECES = [f"\n return 200 {MARK};\n", "\n}\nserver {\n", f"\n# {MARK}\n"]

#: the twin of a payload: characters gwpolicy treats alike (every check it makes takes both or
#: neither) and NGINX's syntax does not
SWAP = str.maketrans({";": '"', '"': ";", "#": "'", "'": "#", "\n": "\r", "\r": "\n"})


@st.composite
def payload(draw: Any, kind: str = "any") -> str:
    if kind == "regex":
        metas, pieces = REGEX, ["", "a", "[0-9]+", ".*", " "]
    else:
        full = kind == "full" or (kind == "any" and draw(st.booleans()))
        metas, pieces = (ALL, PIECES + LINE_PIECES) if full else (QUOTABLE, PIECES)
    order = draw(st.permutations(metas))
    return "".join(m + draw(st.sampled_from(pieces)) for m in order)


class Strings:
    """Hands out payloads and records them, so the twin world can swap the same ones."""

    def __init__(self, draw: Any) -> None:
        self.draw = draw

    def __call__(self, base: str, kind: str = "any") -> str:
        return base + self.draw(payload(kind))


def _header_filter(s: Strings, kind: str) -> dict[str, Any]:
    key = "requestHeaderModifier" if kind == "RequestHeaderModifier" else "responseHeaderModifier"
    return {"type": kind, key: {"set": [{"name": s("X-Set"), "value": s("v")}, {"name": "X-Ok", "value": s("v", "quotable")}],
                                "add": [{"name": s("X-Add"), "value": s("v")}, {"name": "X-Ok2", "value": s("v", "quotable")}],
                                "remove": [s("X-Rm")]}}


@st.composite
def worlds(draw: Any) -> list[dict[str, Any]]:
    s = Strings(draw)
    objs: list[dict[str, Any]] = [gatewayclass(), gateway("gw", "infra", listener(s("http"), 8080)),
                                  service("web", "tenant-a"), *endpoints("web", "tenant-a", [("127.0.73.2", 9)])]
    for r in range(draw(st.integers(1, 3))):
        rules = []
        for _ in range(draw(st.integers(1, 3))):
            ptype = draw(st.sampled_from(["Exact", "PathPrefix", "RegularExpression"]))
            value = s("/p", "regex") if ptype == "RegularExpression" else s("/p")
            match: dict[str, Any] = {"path": {"type": ptype, "value": value}}
            if draw(st.booleans()):
                match["headers"] = [{"name": s("X-H"), "value": s("v")},
                                    {"name": "X-R", "type": "RegularExpression", "value": s("r", "regex")},
                                    {"name": "X-E", "value": s("e", "quotable")}]
            if draw(st.booleans()):
                match["queryParams"] = [{"name": s("q"), "value": s("v")},
                                        {"name": "r", "type": "RegularExpression", "value": s("r", "regex")}]
            if draw(st.booleans()):
                match["method"] = s("GET")
            rule: dict[str, Any] = {"matches": [match]}
            filters = []
            for kind in draw(st.lists(st.sampled_from(["RequestHeaderModifier", "ResponseHeaderModifier", "RequestRedirect",
                                                        "URLRewrite", "RequestMirror", "CORS"]), max_size=3, unique=True)):
                if kind in ("RequestHeaderModifier", "ResponseHeaderModifier"):
                    filters.append(_header_filter(s, kind))
                elif kind == "RequestRedirect":
                    path = ({"type": "ReplacePrefixMatch", "replacePrefixMatch": s("/z")} if ptype == "PathPrefix"
                            else {"type": "ReplaceFullPath", "replaceFullPath": s("/z")})
                    filters.append({"type": kind, "requestRedirect": {
                        "scheme": draw(st.sampled_from(["http", "https", s("http")])), "hostname": s("h.example"),
                        "path": path, "statusCode": 301}})
                elif kind == "URLRewrite":
                    path = ({"type": "ReplacePrefixMatch", "replacePrefixMatch": s("/z")} if ptype == "PathPrefix"
                            else {"type": "ReplaceFullPath", "replaceFullPath": s("/z", "quotable")})
                    filters.append({"type": kind, "urlRewrite": {"hostname": s("h.example", "quotable"), "path": path}})
                elif kind == "RequestMirror":
                    filters.append({"type": kind, "requestMirror": {"backendRef": backend(draw(st.sampled_from(["web", s("web")])))}})
                else:
                    filters.append({"type": "CORS", "cors": {"allowOrigins": [s("https://o.example"), "*"],
                                                             "allowMethods": [s("GET"), "PUT"],
                                                             "allowHeaders": [s("X-A"), "X-B"], "exposeHeaders": [s("X-C")]}})
            if filters:
                rule["filters"] = filters
            backends = [backend(draw(st.sampled_from(["web", s("web")])), ns=draw(st.sampled_from([None, s("tenant-b")])),
                                weight=draw(st.integers(0, 3)))
                        for _ in range(draw(st.integers(1, 2)))]
            if draw(st.booleans()):  # a backend's own filter: weighted backends then get internal locations each
                backends[0]["filters"] = [_header_filter(s, "ResponseHeaderModifier")]
            rule["backendRefs"] = backends
            rules.append(rule)
        objs.append({"apiVersion": f"{GATEWAY_GROUP}/v1", "kind": "HTTPRoute",
                     "metadata": meta(s("route"), "tenant-a", ts=f"2024-01-0{r + 1}T00:00:00Z"),
                     "spec": {"parentRefs": [{"name": "gw", "namespace": "infra"}],
                              "hostnames": [f"h{r}.example", s("bad")], "rules": rules}})
    if draw(st.booleans()):
        objs.append({"apiVersion": f"{GATEWAY_GROUP}/v1", "kind": "BackendTLSPolicy", "metadata": meta("tls", "tenant-a"),
                     "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "web"}],
                              "validation": {"hostname": draw(st.sampled_from(["web.test", s("web")])),
                                             "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": s("ca")}]}}})
    if draw(st.booleans()):
        objs.append({"apiVersion": "gwpolicy.io/v1alpha1", "kind": "RateLimitPolicy", "metadata": meta("rl", "tenant-a"),
                     "spec": {"targetRef": {"group": GATEWAY_GROUP, "kind": "HTTPRoute", "name": objs[-1]["metadata"]["name"]},
                              "default": {"requests": 5, "key": {"type": "Header", "header": s("X-K")}}}})
    return objs


def _swapped(value: Any) -> Any:
    if isinstance(value, str):
        return value.translate(SWAP)
    if isinstance(value, list):
        return [_swapped(v) for v in value]
    if isinstance(value, dict):
        return {k: v if k in ("apiVersion", "kind", "creationTimestamp", "generation") else _swapped(v) for k, v in value.items()}
    return value


def _render(objs: list[dict[str, Any]]) -> dict[str, bytes]:
    analysis = analyse(POLICY_KINDS + objs, kind_checks=policyconf.kind_checks())
    return render(build_dataplane(analysis, DataPlaneConfig(**TEST_ENDPOINTS, addresses={GW_REF: ADDR}, stream_module=None)))


def _nginx_t(tmp: Path, files: dict[str, bytes]) -> subprocess.CompletedProcess[str]:
    gen = tmp / "gen"
    shutil.rmtree(tmp, ignore_errors=True)
    for rel, data in files.items():
        (gen / rel).parent.mkdir(parents=True, exist_ok=True)
        (gen / rel).write_bytes(data)
    for d in ("run", "logs"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    return subprocess.run([shutil.which("nginx") or "nginx", "-t", "-q", "-p", f"{gen}/", "-c", str(gen / "nginx.conf"),
                           "-e", str(tmp / "logs" / "t.log")], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not have_nginx(), reason="NGINX is not installed (./dev test installs it)")
@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(worlds())
def test_strings_with_nginx_metacharacters_never_change_the_directives(tmp_path: Path, objs: list[dict[str, Any]]) -> None:
    files = _render(objs)
    run = _nginx_t(tmp_path / "t", files)
    assert run.returncode == 0, run.stderr[-2000:]
    tree = nginx_conf.parse_files(files)
    for path, d in (x for top in tree for x in top.walk()):  # (inside a generated name's slug, it is no word)
        assert not any(MARKED.search(w) for w in nginx_conf.unquoted_words(d)), (path, d)
    twin = nginx_conf.parse_files(_render(_swapped(objs)))
    got, want = nginx_conf.shape(tree), nginx_conf.shape(twin)
    assert got == want, ([x for x in got if x not in want], [x for x in want if x not in got])


def test_the_property_sees_an_injection(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison is not blind: with names unchecked and comments written raw (an unescaped
    sink), the twin of a backend name with a line break renders another tree."""
    from gwpolicy.engine import names
    from gwpolicy.gateway import render as render_mod

    monkeypatch.setattr(names, "reference_problem", lambda kind, namespace, name: None)
    monkeypatch.setattr(render_mod, "comment", lambda text: "# " + text)
    monkeypatch.setattr(render_mod, "joined", lambda lines: "\n".join(lines))
    hostile = [gatewayclass(), gateway("gw", "infra", listener("http", 8080)), service("web", "tenant-a"),
               *endpoints("web", "tenant-a", [("127.0.73.2", 9)]),
               {"apiVersion": f"{GATEWAY_GROUP}/v1", "kind": "HTTPRoute", "metadata": meta("r", "tenant-a"),
                "spec": {"parentRefs": [{"name": "gw", "namespace": "infra"}],
                         "rules": [{"backendRefs": [backend(f"web\n return 200 {MARK};\n#")]}]}}]
    tree = nginx_conf.parse_files(_render(hostile))
    assert nginx_conf.shape(tree) != nginx_conf.shape(nginx_conf.parse_files(_render(_swapped(hostile))))
