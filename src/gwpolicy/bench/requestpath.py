"""What a request can make NGINX 1.22 walk in a rendered configuration: the lists NGINX searches
one entry at a time on the request path, measured from the configuration's text.

A request's work stays the same whatever the number of routes when every lookup on its path is a
hash or NGINX's static location tree; these constructs instead walk a list, entry by entry (the
functions are NGINX's, seen with callgrind):

- `proxy_pass` with a variable: ngx_http_upstream_init_request compares the evaluated host with
  every `upstream` in definition order (ngx_strncasecmp, ~60 instructions an upstream);
- a jump to a named location (`error_page ... = @x`, `try_files ... @x`, a variable holding `@x`):
  ngx_http_named_location compares the name with the server's named locations (in NGINX's sorted
  order, ~31 instructions each);
- regular-expression locations (`location ~`), tried in order after the static tree;
- regular-expression server names (`server_name ~`), tried in order after the hashes;
- a `map` with regular-expression keys, tried in order until one matches (a map's exact keys and
  `hostnames` are hashes).

`walks(files)` measures each; `growth(small, large)` says which grew between the renderings of a
small and a large cluster: a test renders both and asserts nothing grows, so per-request work
cannot come to depend on the number of routes again unseen. `exempt` names locations whose
variable `proxy_pass` is known and accepted (a fallback that only some request URIs reach).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable

#: directives whose argument can be a named location a request jumps to
_JUMPS = ("error_page", "try_files", "post_action")
#: error codes NGINX produces itself (a jump on them is not on every request's path)
_ERROR_ONLY = {"494", "495", "496", "497"}


@dataclass
class Walks:
    """The longest list of each kind a request can walk, with where it was found."""

    upstreams: int = 0  # `upstream` blocks: the list a variable proxy_pass walks
    variable_proxy_pass: list[str] = field(default_factory=list)  # locations (not exempt) with one
    named_locations: int = 0  # most named locations in one server that has a per-request jump
    regex_locations: int = 0  # most regex locations in one server
    regex_server_names: int = 0  # most regex server names on one listen address
    map_regexes: int = 0  # most regex keys in one map
    where: dict[str, str] = field(default_factory=dict)  # kind -> the server or map that has the most

    def lists(self) -> dict[str, int]:
        """Each kind's list length a request may walk (0 when no request walks it)."""
        return {"upstreams walked by a variable proxy_pass": self.upstreams if self.variable_proxy_pass else 0,
                "named locations walked by a jump": self.named_locations,
                "regex locations tried": self.regex_locations,
                "regex server names tried": self.regex_server_names,
                "regex keys of one map tried": self.map_regexes}


def parse(files: dict[str, bytes]) -> list[dict[str, Any]]:
    """The configuration as crossplane's tree (includes followed), from the rendered files."""
    import crossplane  # type: ignore[import-untyped]

    with tempfile.TemporaryDirectory(prefix="gwpolicy-shape-") as d:
        for rel, data in files.items():
            path = os.path.join(d, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as fh:
                fh.write(data)
        out = crossplane.parse(os.path.join(d, "nginx.conf"), combine=True, check_ctx=False, check_args=False)
    if out["errors"]:
        raise ValueError(f"the configuration does not parse: {out['errors'][0].get('error')}")
    parsed: list[dict[str, Any]] = out["config"][0]["parsed"]
    return parsed


def _blocks(tree: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    found = []
    for d in tree:
        if d["directive"] == name:
            found.append(d)
        if "block" in d and d["directive"] in ("http", "stream"):
            found += _blocks(d["block"], name)
    return found


def _locations(block: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for d in block:
        if d["directive"] == "location":
            out.append(d)
            out += _locations(d.get("block", []))
    return out


def _has_variable(url: str) -> bool:
    return "$" in url


def _map_targets(maps: dict[str, dict[str, Any]]) -> dict[str, set[str]]:
    """map variable -> the values it can take (what a `= $var` jump may name)."""
    return {var: {d["args"][0] for d in m.get("block", []) if d["args"]} for var, m in maps.items()}


def walks(files: dict[str, bytes], exempt: Callable[[str], bool] = lambda location: False) -> Walks:
    """Measure what a request may walk (see the module docstring)."""
    tree = parse(files)
    w = Walks()
    w.upstreams = len([u for u in _blocks(tree, "upstream")])
    maps = {m["args"][1]: m for m in _blocks(tree, "map") if len(m["args"]) == 2}
    values = _map_targets(maps)
    for var, m in maps.items():
        n = sum(1 for d in m.get("block", []) if d["directive"].startswith("~"))
        if n > w.map_regexes:
            w.map_regexes, w.where["map"] = n, var
    regex_names: dict[str, int] = {}
    for s in [b for b in _blocks(tree, "server") if any(d["directive"] == "location" for d in b.get("block", []))]:
        block = s.get("block", [])
        listen = ";".join(sorted(" ".join(d["args"][:1]) for d in block if d["directive"] == "listen"))
        names = [a for d in block if d["directive"] == "server_name" for a in d["args"]]
        regex_names[listen] = regex_names.get(listen, 0) + sum(1 for n in names if n.startswith("~"))
        label = f"server {listen} {' '.join(names)}".strip()
        locs = _locations(block)
        named = [l for l in locs if l["args"] and l["args"][0].startswith("@")]
        regex = [l for l in locs if l["args"] and l["args"][0] in ("~", "~*")]
        if len(regex) > w.regex_locations:
            w.regex_locations, w.where["regex locations"] = len(regex), label
        jumps = False
        for l in [{"block": block, "args": ["(server)"]}] + locs:
            for d in l.get("block", []):
                if d["directive"] == "proxy_pass" and d["args"] and _has_variable(d["args"][0]):
                    where = " ".join(l["args"])
                    if not exempt(l["args"][-1]):
                        w.variable_proxy_pass.append(f"{label}: location {where}: proxy_pass {d['args'][0]}")
                if d["directive"] in _JUMPS and _jumps_to_named(d, values):
                    jumps = True
        if jumps and len(named) > w.named_locations:
            w.named_locations, w.where["named locations"] = len(named), label
    w.regex_server_names = max(regex_names.values(), default=0)
    return w


def _jumps_to_named(d: dict[str, Any], values: dict[str, set[str]]) -> bool:
    """A directive that sends requests to a named location on a request's ordinary path."""
    args = d["args"]
    if d["directive"] == "error_page" and all(a in _ERROR_ONLY for a in args[:-1] if a.isdigit()):
        return False
    target = args[-1] if args else ""
    if target.startswith("@"):
        return True
    return target.startswith("$") and any(v.startswith("@") for v in values.get(target, ()))


def growth(small: Walks, large: Walks) -> list[str]:
    """The lists a request walks that are longer in the large rendering than in the small one,
    each said with both lengths and where; empty when per-request work does not grow."""
    out = []
    a, b = small.lists(), large.lists()
    for kind in a:
        if b[kind] > a[kind]:
            out.append(f"{kind}: {a[kind]} -> {b[kind]}")
    if large.variable_proxy_pass:
        out.append(f"proxy_pass with variables ({len(large.variable_proxy_pass)}, each walks the {large.upstreams} "
                   f"upstreams), e.g. {large.variable_proxy_pass[0]}")
    return out
