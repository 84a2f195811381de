"""HTTPRoute `RegularExpression` path matches: the dialect this data plane serves (issue: regex paths).

One check, read by status (the route's `Accepted=False/UnsupportedValue` names the field) and by the
data plane (which leaves such a match out), so they never disagree and nothing NGINX would refuse to
load reaches it. The dialect is PCRE2 as NGINX compiles it (no UTF mode, case-sensitive), held to
the syntax RE2 accepts: an expression written for an Envoy-based implementation works here and one
that works here works there, and the constructs that make backtracking matchers slow or that do not
exist in RE2 (backreferences, lookaround, atomic groups, possessive quantifiers, recursion) are
refused. See docs/gateway.md "Regular expression paths".
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import re2  # type: ignore[import-untyped]  # google-re2 ships neither stubs nor py.typed

#: the expression is matched against the whole path: render.py wraps it in this
ANCHORED = r"^(?:{})\z"  # \z: the end of the path (a `$` also matches before a final newline)
MAX_LENGTH = 1024  # the CRD's maxLength for path.value

_QUIET = re2.Options()
_QUIET.log_errors = False  # the reason is returned; RE2 would also print it to stderr


def problem(value: object, max_length: int = MAX_LENGTH) -> str | None:
    """Why `value` cannot be served as a RegularExpression match (path, or with the CRD's
    `max_length` of its field a header or query parameter value); None when it can."""
    return _problem(value, max_length) if isinstance(value, str) else "the value is not a string"


#: the CRD's maxLength of a header and of a query parameter value
CONDITION_MAX_LENGTH = {"headers": 4096, "queryParams": 1024}


def condition_problem(match: dict[str, object]) -> tuple[str, str] | None:
    """The first header or query parameter RegularExpression of an HTTPRouteMatch outside the
    dialect: (field below the match, e.g. `headers[0].value`, why); None when there is none. The
    data plane's match map holds these expressions too, so one NGINX refuses would stop every
    change of every Gateway from loading."""
    for kind, limit in CONDITION_MAX_LENGTH.items():
        items = match.get(kind)
        for i, c in enumerate(items if isinstance(items, list) else []):
            if isinstance(c, dict) and c.get("type") == "RegularExpression":
                why = problem(c.get("value", ""), limit)
                if why is not None:
                    return f"{kind}[{i}].value", why
    return None


@functools.lru_cache(maxsize=4096)
def _problem(value: str, max_length: int) -> str | None:
    if not value:
        return "the expression is empty"
    if len(value) > max_length:
        return f"the expression is longer than {max_length} characters"
    bad = next((c for c in value if not " " <= c <= "~"), None)
    if bad is not None:
        return (f"the expression contains {bad!r}; only printable ASCII characters are accepted (NGINX matches "
                "the path's bytes, RE2 its characters: they would differ)")
    try:
        compiled = re2.compile(value, options=_QUIET)
        re2.compile(ANCHORED.format(value), options=_QUIET)
    except re2.error as e:  # what RE2 does not accept (e.g. backreferences, lookaround)
        why = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        return f"not a regular expression in RE2's syntax ({why})"
    except Exception as e:  # noqa: BLE001 - the binding raises other types for some inputs
        return f"not a regular expression in RE2's syntax ({type(e).__name__}: {e})"
    if compiled.groupindex:
        return ("named groups are not accepted (NGINX would turn them into variables); "
                "use (?:...) or an unnamed group")
    pcre_why = _pcre2_error(ANCHORED.format(value))
    if pcre_why is not None:
        return f"NGINX's PCRE2 does not accept it ({pcre_why})"
    return None


@functools.lru_cache(maxsize=1)
def _pcre2() -> ctypes.CDLL | None:
    """The PCRE2 library NGINX is linked with (Debian: libpcre2-8), None where it is absent."""
    name = ctypes.util.find_library("pcre2-8") or "libpcre2-8.so.0"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    lib.pcre2_compile_8.restype = ctypes.c_void_p
    lib.pcre2_compile_8.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.POINTER(ctypes.c_int),
                                    ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p]
    lib.pcre2_code_free_8.argtypes = [ctypes.c_void_p]
    lib.pcre2_get_error_message_8.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    return lib


def _pcre2_error(pattern: str) -> str | None:
    """PCRE2's compile error for `pattern` with NGINX's options (none: `~`, not `~*`); None: it compiles.
    Without the library (NGINX is not installed here) only RE2's check applies."""
    lib = _pcre2()
    if lib is None:
        return None
    data = pattern.encode()
    err, offset = ctypes.c_int(), ctypes.c_size_t()
    code = lib.pcre2_compile_8(data, len(data), 0, ctypes.byref(err), ctypes.byref(offset), None)
    if code:
        lib.pcre2_code_free_8(code)
        return None
    buf = ctypes.create_string_buffer(256)
    lib.pcre2_get_error_message_8(err, buf, len(buf))
    return f"{buf.value.decode(errors='replace')} at offset {offset.value}"


@functools.lru_cache(maxsize=65536)
def literal_prefix(value: str) -> str:
    """A string every path the expression matches starts with ("" when it cannot tell). The data
    plane lists a regex rule only in the locations whose paths can start with it, so a host's
    other locations stay as they were (their maps, and the body size NGINX checks before it knows
    the rule: policyconf's uri_lines). Conservative: any top-level `|`, a leading group, class or
    escape, or a flag gives ""."""
    if _top_level_alternation(value):
        return ""
    i = 1 if value.startswith("^") else 0
    start = i
    while i < len(value) and value[i] not in _META:
        i += 1
    literal = value[start:i]
    if i < len(value) and value[i] in "*?{":  # the last character may occur zero times
        literal = literal[:-1]
    return literal


_META = frozenset(".^$*+?()[]{}|\\")


def _top_level_alternation(value: str) -> bool:
    """Is there a `|` outside every group and class (escapes, `\\Q...\\E` and classes skipped)?"""
    depth, i, n = 0, 0, len(value)
    while i < n:
        c = value[i]
        if c == "\\":
            if value.startswith("\\Q", i):
                end = value.find("\\E", i + 2)
                i = n if end < 0 else end + 2
                continue
            i += 2
            continue
        if c == "[":  # a class: `]` right after `[` or `[^` is literal, `[:alpha:]` nests once
            i += 1
            if i < n and value[i] == "^":
                i += 1
            if i < n and value[i] == "]":
                i += 1
            while i < n and value[i] != "]":
                if value[i] == "\\":
                    i += 2
                    continue
                if value.startswith("[:", i):
                    end = value.find(":]", i + 2)
                    i = i + 1 if end < 0 else end + 2
                    continue
                i += 1
            i += 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth <= 0:
            return True
        i += 1
    return False
