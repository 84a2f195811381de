"""Match maps: the `map` that picks a location's rule from method, headers, query parameters and
RegularExpression paths (one regex per rule, in the spec's precedence), and the maps each
regular expression becomes. Each adds its blocks to `maps` (variable -> block)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from gwpolicy.gateway import pathregex
from gwpolicy.gateway.conftext import EMPTY, RenderError, conf_string, header_var, pcre_literal, put, request_header_var

#: RegularExpression fields one match map takes: NGINX refuses a parameter (the map's source)
#: longer than 4 KiB, and each field is a 20-character variable; a location with more regex
#: candidates chains maps (the default of one jumps to the next, in precedence order)
REGEX_FIELDS_PER_MAP = 120


def chunks(cands: list[Any]) -> list[list[Any]]:
    """The candidate list cut where a map would take more than REGEX_FIELDS_PER_MAP expressions
    (path, header and query parameter expressions: each is a variable of its own in the source)."""
    out: list[list[Any]] = [[]]
    seen: set[Any] = set()
    for c in cands:
        keys = ({c[4]} if c[4] is not None else set()) | {(kind, n.lower(), v) for kind, conds in (("h", c[1]), ("q", c[2]))
                                                          for t, n, v in conds if t == "RegularExpression"}
        new = keys - seen
        if new and len(seen) + len(new) > REGEX_FIELDS_PER_MAP and out[-1]:
            out.append([])
            seen = set()
        seen |= keys
        out[-1].append(c)
    return out


def match_map(cands: list[tuple[str | None, tuple[tuple[str, str, str], ...], tuple[tuple[str, str, str], ...], str,
                                  str | None]],
               maps: dict[str, str], default: str = "/_gw_404/") -> str:
    """A `map` over method, the headers and the query parameters the rules look at, and whether the
    path matches each RegularExpression (see path_regex), one regex per rule in precedence order
    (NGINX tries a map's regexes in order: the first match wins); its value is the internal location
    (URI) of the rule. No match: 404. Header names are case-insensitive ($http_*); NGINX's $arg_* are too, so query parameter names are matched case-insensitively."""
    def source_of(kind: str, name: str) -> str:
        if kind == "header":
            return f"$http_{request_header_var(name)}"
        if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise RenderError(f"query parameter name {name!r} cannot be matched by NGINX ($arg_ takes letters, digits, - and _)")
        return f"$arg_{header_var(name)}"

    # each condition as (field, the text it must be): a method or an Exact value compared in this
    # map, a RegularExpression (path, header or query parameter) through a map of its own that
    # matches the whole value, read here as `1`
    wants: list[dict[str, str]] = []
    for method, headers, query, target, regex in cands:
        want: dict[str, str] = {}
        if regex is not None:
            want[path_regex(regex, maps)] = "1"
        if method:
            want["$request_method"] = method
        for kind, conds in (("header", headers), ("query", query)):
            for t, n, v in conds:
                src = source_of(kind, n if kind == "header" else n.lower())
                if t == "RegularExpression":
                    want[value_regex(src, v, maps)] = "1"
                else:
                    want[src] = v
        wants.append(want)
    fields = sorted({f for want in wants for f in want}, key=lambda f: (f != "$request_method", f))
    source = "".join(f + "\n" for f in fields)
    entries = []
    for (method, headers, query, target, regex), want in zip(cands, wants):
        if not want:
            default = target
            break
        pattern = "^" + "".join(("[^\n]*" if f not in want else pcre_literal(want[f])) + "\n" for f in fields)
        entries.append(f"    {conf_string('~' + pattern + '$')} {target};\n")
    body = "".join(entries) + f"    default {default};\n"
    var = "$gw_m_" + hashlib.sha1((source + body).encode()).hexdigest()[:12]
    src = conf_string(source) if source else EMPTY
    put(maps, var, f"map {src} {var} {{\n{body}}}\n")
    return var


#: the request's path as the client sent it to the server, before the virtual host's prefix (see
#: render._server), what RegularExpression path matches are matched against: NGINX's normalised,
#: percent-decoded $uri
PATH_VAR = "$gw_uri"


def path_regex(regex: str, maps: dict[str, str]) -> str:
    """A variable that is `1` when the request's whole path matches `regex` (the dialect is
    pathregex's: the data plane has left out every expression it refuses), else empty. One map
    per expression, shared by every location that lists it (NGINX evaluates a map only when a
    request reads its variable). The expression is a quoted map key: nothing in it is NGINX syntax."""
    why = pathregex.problem(regex)
    if why is not None:  # the data plane never hands one over; never let one reach NGINX
        raise RenderError(f"path regular expression {regex!r}: {why}")
    return regex_map("$gw_rx_" + hashlib.sha1(regex.encode()).hexdigest()[:12], PATH_VAR, regex, maps)


def value_regex(source: str, regex: str, maps: dict[str, str]) -> str:
    """A variable that is `1` when the whole value of `source` (a header's `$http_`, a query
    parameter's `$arg_`) matches `regex`, as RE2's full match: `^` and `$` of the expression, if
    it has them, are the value's start and end."""
    why = pathregex.problem(regex, 4096)
    if why is not None:  # the data plane leaves such matches out; never let one reach NGINX
        raise RenderError(f"regular expression {regex!r}: {why}")
    return regex_map("$gw_vx_" + hashlib.sha1(f"{source}\n{regex}".encode()).hexdigest()[:12], source, regex, maps)


def regex_map(var: str, source: str, regex: str, maps: dict[str, str]) -> str:
    put(maps, var, f"map {source} {var} {{\n    {conf_string('~' + pathregex.ANCHORED.format(regex))} 1;\n"
                       "    default \"\";\n}\n")
    return var
