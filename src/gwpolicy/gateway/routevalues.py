"""An HTTPRoute's values that NGINX 1.22 cannot carry, found before anything is rendered.

NGINX reads its configuration in a 4 KiB buffer and refuses a parameter (a quoted string, a map
key) that does not fit, and with it the whole configuration, every tenant's. The renderer writes
each value through one escaping (conftext.quote, conftext.conf_string) and never emits a longer
parameter (it answers 500 instead); this module says the same of the route's own fields first, so
that status can make the route `Accepted=False`/`UnsupportedValue` naming the field, and the data
plane serves nothing of it. Lengths are measured on what the renderer would write: header values
quoted, match values escaped for PCRE and quoted inside the map key that holds all the conditions
of one match. Pure.
"""

from __future__ import annotations

from typing import Any, Iterator

from gwpolicy.gateway import pathregex
from gwpolicy.gateway.conftext import (
    MAX_PARAMETER,
    RenderError,
    conf_string_unchecked,
    header_name,
    header_var,
    pcre_literal,
    quote,
)

#: one match's part of its map key, and of the map's source (the variables it reads): the rest of
#: NGINX's parameter is left for the `[^\n]*` (8 bytes) of each field other rules of its location
#: look at, so that a location's rules together still fit
MATCH_BUDGET = 3072


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def problems(spec: Any) -> list[tuple[str, str]]:
    """(field, why) for every value of an HTTPRoute spec the renderer could not write."""
    return list(_problems(_dict(spec)))


def _problems(spec: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for ri, rule in enumerate(r for r in _list(spec.get("rules")) if isinstance(r, dict)):
        where = f"spec.rules[{ri}]"
        for mi, m in enumerate(x for x in _list(rule.get("matches")) if isinstance(x, dict)):
            yield from _match(m, f"{where}.matches[{mi}]")
        for fi, f in enumerate(_list(rule.get("filters"))):
            yield from _filter(_dict(f), f"{where}.filters[{fi}]")
        for bi, b in enumerate(_list(rule.get("backendRefs"))):
            for fi, f in enumerate(_list(_dict(b).get("filters"))):
                yield from _filter(_dict(f), f"{where}.backendRefs[{bi}].filters[{fi}]")


def _quoted(value: Any, where: str, extra: int = 0) -> Iterator[tuple[str, str]]:
    """A value the renderer writes as one quoted string (`extra`: what it writes around it)."""
    text = str(value)
    try:
        size = len(quote(text).encode()) + extra
    except RenderError as exc:
        size = len(text.encode()) + 2  # at least (the escaping adds to it)
        if "cannot carry" in str(exc):
            yield where, str(exc)
            return
    if size > MAX_PARAMETER:
        yield where, f"{size} bytes or more once quoted for NGINX, which takes at most {MAX_PARAMETER}"


def _match(m: dict[str, Any], where: str) -> Iterator[tuple[str, str]]:
    """The map key of one match holds every condition it has (rendermaps.match_map); a
    RegularExpression condition has a map of its own, whose key must fit too."""
    key, source = "", ""
    if isinstance(m.get("method"), str):
        key += pcre_literal(m["method"]) + "\n"
        source += "$request_method\n"
    for kind, var in (("headers", "http"), ("queryParams", "arg")):
        for ci, c in enumerate(_list(m.get(kind))):
            c = _dict(c)
            name, value = str(c.get("name", "")), str(c.get("value", ""))
            if c.get("type") == "RegularExpression":  # a map of its own (rendermaps.value_regex), read as `1`
                size = _escaped_size("~" + pathregex.ANCHORED.format(value))
                if size > MAX_PARAMETER:
                    yield f"{where}.{kind}[{ci}].value", (f"{size} bytes once quoted for NGINX, which takes at most "
                                                          f"{MAX_PARAMETER}")
                key += "1\n"
                source += "$gw_vx_123456789abc\n"
                continue
            key += pcre_literal(value) + "\n"
            source += f"${var}_{header_var(name)}\n"
    for what, text in (("match conditions", "~^" + key + "$"), ("header and query parameter names", source)):
        if not key:
            break
        size = _escaped_size(text)
        if size > MATCH_BUDGET:
            yield where, (f"its {what} take {size} bytes in NGINX's match map, at most {MATCH_BUDGET} "
                          "(fewer or shorter header and query parameter matches)")


def _escaped_size(text: str) -> int:
    """Bytes of `text` as conftext.conf_string writes it (a quoted map key or source)."""
    return len(conf_string_unchecked(text).encode())


def _filter(f: dict[str, Any], where: str) -> Iterator[tuple[str, str]]:
    ftype = f.get("type")
    if ftype in ("RequestHeaderModifier", "ResponseHeaderModifier"):
        conf = _dict(f.get(ftype[0].lower() + ftype[1:]))
        key = ftype[0].lower() + ftype[1:]
        for op in ("set", "add"):
            for hi, h in enumerate(_list(conf.get(op))):
                h = _dict(h)
                name = h.get("name")
                extra = 0
                if op == "add" and ftype == "RequestHeaderModifier" and isinstance(name, str):
                    try:  # `"${gw_add_<name>}<value>"`: the client's value, a comma, then ours
                        extra = len("${gw_add_" + header_var(header_name(name)) + "}")
                    except RenderError:
                        pass  # the header name is refused elsewhere (the rule answers 500)
                yield from _quoted(h.get("value", ""), f"{where}.{key}.{op}[{hi}].value", extra)
    elif ftype in ("URLRewrite", "RequestRedirect"):
        key = "urlRewrite" if ftype == "URLRewrite" else "requestRedirect"
        conf = _dict(f.get(key))
        if isinstance(conf.get("hostname"), str):
            # a redirect writes it inside `"<scheme>://<host>:<port><variables>"`
            yield from _quoted(conf["hostname"], f"{where}.{key}.hostname", 48 if ftype == "RequestRedirect" else 0)
        path = _dict(conf.get("path"))
        for field in ("replaceFullPath", "replacePrefixMatch"):
            if isinstance(path.get(field), str):
                yield from _quoted(path[field], f"{where}.{key}.path.{field}", 2)
    elif ftype == "CORS":
        conf = _dict(f.get("cors"))
        for oi, origin in enumerate(_list(conf.get("allowOrigins"))):
            if isinstance(origin, str) and origin != "*":
                size = _escaped_size("~*^" + ".*".join(pcre_literal(p) for p in origin.split("*")) + "$")
                if size > MAX_PARAMETER:
                    yield (f"{where}.cors.allowOrigins[{oi}]",
                           f"{size} bytes once escaped for NGINX, which takes at most {MAX_PARAMETER}")
        for field in ("allowMethods", "allowHeaders", "exposeHeaders"):
            names = [n for n in _list(conf.get(field)) if isinstance(n, str)]
            if names and "*" not in names:
                yield from _quoted(", ".join(names), f"{where}.cors.{field}")
