"""NGINX configuration text: the one way any value reaches the rendered files. Quoting,
escaping, comments, header and variable names, the length NGINX 1.22 can read in one parameter,
and the final guard against a line break render did not write (`joined`). Read by the renderer
and by routevalues (which facts asks whether NGINX could read a route's values)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

EMPTY = '""'


class RenderError(ValueError):
    """A value NGINX cannot carry (names the route and field)."""


class LineBreakError(RenderError):
    """A generated line holds a line break render did not write: the final guard (see joined)."""


def comment(text: str) -> str:
    """A `#` comment holding `text`, the one way any text reaches a comment: printable ASCII stays,
    everything else (a line break above all, which would end the comment and make the rest
    configuration) is written as a Python escape (`\\n`, `\\x01`, `\\u00e9`, and `\\\\`)."""
    if not _PRINTABLE.fullmatch(text):
        text = text.encode("unicode_escape").decode("ascii")
    return "# " + text


_PRINTABLE = re.compile(r"[ -\[\]-~]*")  # printable ASCII without the backslash


def joined(lines: list[str]) -> str:
    """`lines` as one text, one line each: the final guard before text is written. A line holding a
    line break (LF, or CR, which NGINX also reads as a space between words) that render did not
    write would be a sink that skipped the escaping: raise, so that the route's rule (or the
    block) fails closed instead of loading it."""
    text = "\n".join(lines)
    if text.count("\n") != len(lines) - 1 or "\r" in text:
        bad = next(l for l in lines if "\n" in l or "\r" in l)
        raise LineBreakError(f"a generated line holds a line break: {bad[:200]!r}")
    return text


#: NGINX 1.22 reads its configuration in a 4 KiB buffer and refuses a parameter (a quoted string, a
#: map key) of 4096 bytes or more, quotes included, depending on where it falls in the buffer; one
#: of 4095 bytes always passes (measured at every offset)
MAX_PARAMETER = 4095


def param(text: str) -> str:
    """`text` as one NGINX parameter, or RenderError when NGINX could not read it (never emitted)."""
    size = len(text.encode())
    if size > MAX_PARAMETER:
        raise RenderError(f"{size} bytes once quoted for NGINX, which takes at most {MAX_PARAMETER}")
    return text


def shown(value: str, limit: int = 60) -> str:
    """A value in a message (messages become comments: never a long line)."""
    return repr(value) if len(value) <= limit else repr(value[:limit]) + f"... ({len(value)} characters)"


def quote(value: str) -> str:
    """An NGINX double-quoted string; `$` would start a variable, so values carrying one are refused."""
    if "$" in value or "\n" in value or "\r" in value:
        raise RenderError(f"value {shown(value)} contains '$' or a line break, which NGINX cannot carry")
    return param('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"')


TOKEN = re.compile(r"[A-Za-z0-9!#%&'*+.^_`|~-]+")


def header_name(name: str) -> str:
    """A header name as RFC 9110 defines a token (anything else could smuggle NGINX syntax in),
    starting with a letter or digit: it is written as a bare word, and a word that starts with `#`
    or `'` would be a comment or a string to NGINX."""
    if not TOKEN.fullmatch(name) or not name[0].isalnum():
        raise RenderError(f"header name {name!r} is not a valid HTTP header name (a token starting with a letter or digit)")
    return name


_REQUEST_HEADER = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*")


def request_header_var(name: str) -> str:
    """The `$http_` variable part of a request header NGINX reads: only letters, digits and `-`
    can name one (NGINX lowercases the name and turns `-` into `_`; any other character would end
    the variable's name and be read as text after it)."""
    if not _REQUEST_HEADER.fullmatch(name):
        raise RenderError(f"header name {name!r}: NGINX reads a request header by a name of letters, digits and '-' only")
    return header_var(name)


def header_var(name: str) -> str:
    return name.lower().replace("-", "_")


def conf_string(text: str) -> str:
    """A double-quoted NGINX string holding `text` exactly (NGINX turns \\n and \\r back into the
    line breaks: written as they are, they would be inside the string too, but no line of the
    rendered files holds one that render did not write, see joined)."""
    return param(conf_string_unchecked(text))


def conf_string_unchecked(text: str) -> str:
    """conf_string without the length check (to measure what it would write)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'


def pcre_literal(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "\\" + c for c in text)


def regex_literal(text: str) -> str:
    """`text` as a PCRE expression that matches it literally (to be written with conf_string)."""
    out = []
    for ch in text:
        out.append("\\" + ch if ch in ".^$*+?()[]{}|\\" else ch)
    return "".join(out)


def put(table: dict[str, str], name: str, block: str) -> None:
    """Define `name` (a map, split_clients variable): names are content-addressed (a digest of what
    the block does) or fixed, so a second definition must be the same block; two different ones
    under one name would make one rule use another's, so the location fails closed instead."""
    was = table.setdefault(name, block)
    if was != block:
        raise RenderError(f"two different definitions of {name}")


def filters_of(fs: Iterable[dict[str, Any]], kind: str, key: str) -> list[dict[str, Any]]:
    """The settings of a rule's filters of one type (`kind`, e.g. RequestHeaderModifier), under `key`."""
    return [v for f in fs if f.get("type") == kind for v in (f.get(key),) if isinstance(v, dict)]


def request_headers(base: Iterable[tuple[str, str]], modifiers: Iterable[dict[str, Any]], maps: dict[str, str],
                    host: str | None = None) -> dict[str, tuple[str, str]]:
    """The headers a backend gets, by lower-case name: `base`, the rewritten Host, then a route's
    RequestHeaderModifier filters (`set` replaces, `add` appends to the client's value through a map
    put in `maps`, `remove` sends none)."""
    headers = {n.lower(): (n, v) for n, v in base}
    if host:
        headers["host"] = ("Host", quote(host))
    for m in modifiers:
        for h in m.get("set") or []:
            if isinstance(h, dict) and isinstance(h.get("name"), str):
                headers[h["name"].lower()] = (header_name(h["name"]), quote(str(h.get("value", ""))))
        for h in m.get("add") or []:
            if isinstance(h, dict) and isinstance(h.get("name"), str):
                n = header_name(h["name"])
                v = request_header_var(n)
                mv = f"$gw_add_{v}"
                put(maps, mv, f"map $http_{v} {mv} {{\n    default \"\";\n    \"~.\" \"$http_{v},\";\n}}\n")
                headers[n.lower()] = (n, param('"${' + mv[1:] + '}' + quote(str(h.get("value", "")))[1:]))
        for name in m.get("remove") or []:
            if isinstance(name, str):
                headers[name.lower()] = (header_name(name), '""')
    return headers


def response_header_directives(modifiers: Iterable[dict[str, Any]], module: str) -> list[str]:
    """A route's ResponseHeaderModifier filters as directives: `set` hides the backend's header and
    adds the new value, `add` adds, `remove` hides; `module` is the proxy module whose
    `*_hide_header` applies (`proxy` for HTTP, `grpc` for gRPC)."""
    out: list[str] = []
    for m in modifiers:
        for h in m.get("set") or []:
            if isinstance(h, dict) and isinstance(h.get("name"), str):
                n = header_name(h["name"])
                out += [f"{module}_hide_header {n};", f"add_header {n} {quote(str(h.get('value', '')))} always;"]
        for h in m.get("add") or []:
            if isinstance(h, dict) and isinstance(h.get("name"), str):
                out.append(f"add_header {header_name(h['name'])} {quote(str(h.get('value', '')))} always;")
        for name in m.get("remove") or []:
            if isinstance(name, str):
                out.append(f"{module}_hide_header {header_name(name)};")
    return out
