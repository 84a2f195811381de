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
from dataclasses import dataclass, field

import re2  # type: ignore[import-untyped]  # google-re2 ships neither stubs nor py.typed

#: the expression is matched against the whole path: render.py wraps it in this
ANCHORED = r"^(?:{})\z"  # \z: the end of the path (a `$` also matches before a final newline)
MAX_LENGTH = 1024  # the CRD's maxLength for path.value

_QUIET = re2.Options()
_QUIET.log_errors = False  # the reason is returned; RE2 would also print it to stderr


def problem(value: object, max_length: int = MAX_LENGTH) -> str | None:
    """Why `value` cannot be served as a RegularExpression match (path, or with the CRD's
    `max_length` of its field a header or query parameter value); None when it can."""
    return path_problem(value, max_length) if isinstance(value, str) else "the value is not a string"


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
def path_problem(value: str, max_length: int) -> str | None:
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
    return repetition_problem(value)


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


# ---------------------------------------------------------------------------------------------
# repetition that a backtracking matcher may take exponential time over
#
# NGINX runs the expressions with PCRE2, which backtracks: where the text inside a repetition can
# be matched in more than one way -- `(a+)+`, `(a|aa)+`, `(a?a)+`, `([a-z]+-?)+` -- a text that
# almost matches makes it try every way, exponentially many. RE2 (what Envoy-based gateways run)
# has no such case, so such expressions are valid RE2 and are refused here alone. The rule, on
# the expression's position automaton (Glushkov): the part a `*`, `+` or `{n,m}` (m > 1) repeats
# must not match the empty text, and at every point of it (its start, after each character, and
# at its end, where the next iteration may start) each character must continue it in one way
# only. `(/[a-z]+)+` passes (a `/` starts the next iteration, a letter continues this one);
# `(a|aa)+` does not (an `a` may start either branch).

_ALL = (1 << 256) - 1
#: a repetition of at most this many times is checked as that many copies (a{2} as aa); one of
#: more, or without a bound, as a loop
UNROLLED = 8


def _bits(chars: str) -> int:
    out = 0
    for c in chars:
        out |= 1 << ord(c)
    return out


def _range(lo: int, hi: int) -> int:
    return ((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1) if lo <= hi else 0


_DIGIT = _range(48, 57)
_WORD = _DIGIT | _range(65, 90) | _range(97, 122) | _bits("_")
_SPACE = _bits(" \t\n\v\f\r")
_PERL = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
_POSIX = {"alnum": _DIGIT | _range(65, 90) | _range(97, 122), "alpha": _range(65, 90) | _range(97, 122),
          "ascii": _range(0, 127), "blank": _bits(" \t"), "cntrl": _range(0, 31) | _bits("\x7f"), "digit": _DIGIT,
          "graph": _range(33, 126), "lower": _range(97, 122), "print": _range(32, 126),
          "punct": _range(33, 47) | _range(58, 64) | _range(91, 96) | _range(123, 126), "space": _SPACE,
          "upper": _range(65, 90), "word": _WORD, "xdigit": _DIGIT | _range(65, 70) | _range(97, 102)}
_SIMPLE_ESCAPES = {"a": 7, "f": 12, "t": 9, "n": 10, "r": 13, "v": 11}


class _Unsure(Exception):
    """A construct this reader does not model: refused (only valid RE2 reaches it, so that is rare)."""


@dataclass
class _Node:
    kind: str  # "char" (a set of bytes), "empty" (anchors, empty groups), "cat", "alt", "rep"
    chars: int = 0
    parts: list["_Node"] = field(default_factory=list)
    min: int = 0
    max: int | None = 0  # None: unbounded
    span: tuple[int, int] = (0, 0)  # where in the expression (for the message)


class _Reader:
    """RE2's syntax (printable ASCII, as path_problem has checked) as a tree of _Node."""

    def __init__(self, text: str) -> None:
        self.s, self.i = text, 0
        self.flags = {"i": False, "s": False}

    def parse(self) -> _Node:
        node = self._alt()
        if self.i != len(self.s):
            raise _Unsure(f"unexpected {self.s[self.i]!r}")
        return node

    def _alt(self) -> _Node:
        start = self.i
        branches = [self._cat()]
        while self.i < len(self.s) and self.s[self.i] == "|":
            self.i += 1
            branches.append(self._cat())
        return branches[0] if len(branches) == 1 else _Node("alt", parts=branches, span=(start, self.i))

    def _cat(self) -> _Node:
        start = self.i
        items: list[_Node] = []
        while self.i < len(self.s) and self.s[self.i] not in "|)":
            items.extend(self._repeated())
        return _Node("cat", parts=items, span=(start, self.i))

    def _repeated(self) -> list[_Node]:
        start = self.i
        atoms = self._atom()
        if len(atoms) != 1:  # \Q...\E: literals, each its own atom (a quantifier takes the last)
            if self.i < len(self.s) and self.s[self.i] in "*+?{" and atoms:
                last = atoms.pop()
                return atoms + self._repeated_of(last, last.span[0])
            return atoms
        return self._repeated_of(atoms[0], start)

    def _repeated_of(self, atom: _Node, start: int) -> list[_Node]:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in "*+?":
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                self.i += 1
            elif c == "{":
                got = _counted(s, self.i)
                if got is None:
                    if s.startswith("{,", self.i):
                        raise _Unsure("`{,n}` is a literal in RE2 and a repetition in newer PCRE2; write `{0,n}` or `\\{`")
                    break
                lo, hi, self.i = got
            else:
                break
            if self.i < len(s) and s[self.i] == "?":  # lazy: the same texts
                self.i += 1
            atom = _Node("rep", parts=[atom], min=lo, max=hi, span=(start, self.i))
        return [atom]

    def _atom(self) -> list[_Node]:
        s, start = self.s, self.i
        c = s[self.i]
        if c == "(":
            return [self._group()]
        self.i += 1
        if c == ".":
            return [_Node("char", chars=_ALL if self.flags["s"] else _ALL & ~_bits("\n"), span=(start, self.i))]
        if c in "^$":
            return [_Node("empty", span=(start, self.i))]
        if c == "[":
            self.i = start
            return [_Node("char", chars=self._fold(self._class()), span=(start, self.i))]
        if c == "\\":
            return self._escape(start)
        return [_Node("char", chars=self._fold(1 << ord(c)), span=(start, self.i))]

    def _group(self) -> _Node:
        s, start = self.s, self.i
        self.i += 1
        saved = dict(self.flags)
        if s.startswith("?", self.i):
            j = self.i + 1
            on = True
            while j < len(s) and s[j] not in ":)":
                if s[j] == "-":
                    on = False
                elif s[j] in "is":
                    self.flags[s[j]] = on
                elif s[j] not in "mU":
                    raise _Unsure(f"group flag {s[j]!r}")
                j += 1
            if j >= len(s):
                raise _Unsure("unterminated group")
            self.i = j + 1
            if s[j] == ")":  # (?i): to the end of the enclosing group
                return _Node("empty", span=(start, self.i))
        node = self._alt()
        if self.i >= len(s) or s[self.i] != ")":
            raise _Unsure("unterminated group")
        self.i += 1
        self.flags = saved
        node.span = (start, self.i)
        return node

    def _escape(self, start: int) -> list[_Node]:
        s = self.s
        if self.i >= len(s):
            raise _Unsure("trailing backslash")
        c = s[self.i]
        self.i += 1
        if c == "Q":
            end = s.find("\\E", self.i)
            text = s[self.i:] if end < 0 else s[self.i:end]
            self.i = len(s) if end < 0 else end + 2
            return [_Node("char", chars=self._fold(1 << ord(ch)), span=(start, self.i)) for ch in text]
        if c in "bBAz":
            return [_Node("empty", span=(start, self.i))]
        return [_Node("char", chars=self._fold(self._escape_set(c)), span=(start, self.i))]

    def _escape_set(self, c: str) -> int:
        """The bytes of the escape whose letter (already read) is `c`."""
        s = self.s
        if c.lower() in _PERL:
            got = _PERL[c.lower()]
            return _ALL & ~got if c.isupper() else got
        if c in "pP":  # Unicode classes: any byte may be part of one (conservative)
            if s.startswith("{", self.i):
                end = s.find("}", self.i)
                self.i = end + 1 if end > 0 else len(s)
            else:
                self.i += 1
            return _ALL
        if c == "C":
            return _ALL
        if c == "x":
            if s.startswith("{", self.i):
                end = s.find("}", self.i)
                value, self.i = int(s[self.i + 1:end], 16), end + 1
            else:
                value, self.i = int(s[self.i:self.i + 2], 16), self.i + 2
            return 1 << value if value < 256 else _ALL
        if c in "01234567":
            j = self.i
            while j < len(s) and j < self.i + 2 and s[j] in "01234567":
                j += 1
            value, self.i = int(s[self.i - 1:j], 8), j
            return 1 << value if value < 256 else _ALL
        if c in _SIMPLE_ESCAPES:
            return 1 << _SIMPLE_ESCAPES[c]
        if c.isalnum():
            raise _Unsure(f"escape \\{c}")
        return 1 << ord(c)

    def _class(self) -> int:
        s = self.s
        self.i += 1  # [
        negate = s.startswith("^", self.i)
        if negate:
            self.i += 1
        out = 0
        first = True
        while self.i < len(s) and (s[self.i] != "]" or first):
            first = False
            if s.startswith("[:", self.i):
                end = s.find(":]", self.i)
                name = s[self.i + 2:end]
                got = _POSIX.get(name.lstrip("^"))
                if end < 0 or got is None:
                    raise _Unsure(f"class [:{name}:]")
                out |= (_ALL & ~got) if name.startswith("^") else got
                self.i = end + 2
                continue
            lo = self._class_char()
            if isinstance(lo, int) and s.startswith("-", self.i) and not s.startswith("-]", self.i):
                self.i += 1
                hi = self._class_char()
                if not isinstance(hi, int):
                    raise _Unsure("a range ending in a class")
                out |= _range(lo, hi)
            else:
                out |= (1 << lo) if isinstance(lo, int) else lo[0]
        if self.i >= len(s):
            raise _Unsure("unterminated class")
        self.i += 1  # ]
        return (_ALL & ~out) if negate else out

    def _class_char(self) -> int | tuple[int]:
        """A character of a class (its code) or an escaped set ((bits,))."""
        s = self.s
        c = s[self.i]
        self.i += 1
        if c != "\\":
            return ord(c)
        e = s[self.i]
        self.i += 1
        if e.lower() in _PERL or e in "pPC":
            return (self._escape_set(e),)
        bits = self._escape_set(e)
        return bits.bit_length() - 1 if bits and bits & (bits - 1) == 0 else (bits,)

    def _fold(self, bits: int) -> int:
        if not self.flags["i"]:
            return bits
        upper, lower = bits & _range(65, 90), bits & _range(97, 122)
        return bits | (upper << 32) | (lower >> 32)


def _counted(s: str, i: int) -> tuple[int, int | None, int] | None:
    """`{n}`, `{n,}`, `{n,m}` at s[i]: (min, max, index after it); None when it is a literal `{`."""
    j = s.find("}", i)
    if j < 0:
        return None
    body = s[i + 1:j]
    lo, sep, hi = body.partition(",")
    if not lo.isdigit() or (hi and not hi.isdigit()):
        return None
    return int(lo), (int(lo) if not sep else (int(hi) if hi else None)), j + 1


class _Positions:
    """The Glushkov position automaton of a tree: nullable, first, last and follow per node."""

    def __init__(self) -> None:
        self.chars: list[int] = []
        self.follow: list[set[int]] = []
        self.loop_of: dict[int, tuple[int, int]] = {}  # a position that repeats itself -> its repetition's span

    def of(self, n: _Node) -> tuple[bool, set[int], set[int]]:
        if n.kind == "char":
            p = len(self.chars)
            self.chars.append(n.chars)
            self.follow.append(set())
            return False, {p}, {p}
        if n.kind == "empty":
            return True, set(), set()
        if n.kind == "alt":
            nullable, first, last = False, set[int](), set[int]()
            for part in n.parts:
                a, f, l = self.of(part)
                nullable, first, last = nullable or a, first | f, last | l
            return nullable, first, last
        if n.kind == "cat":
            return self._sequence(n.parts, len(n.parts))
        if n.max == 0:  # rep
            return True, set(), set()
        if n.max is not None and n.max <= UNROLLED:  # X{n,m} as n copies of X and m-n optional ones
            return self._sequence([n.parts[0]] * n.max, n.min)
        a, f, l = self.of(n.parts[0])
        for p in l:
            self.follow[p] |= f
        for p in l & f:
            self.loop_of.setdefault(p, n.span)
        return a or n.min == 0, f, l


    def _sequence(self, parts: list[_Node], required: int) -> tuple[bool, set[int], set[int]]:
        """Parts one after the other, those from index `required` on optional."""
        nullable, first, last = True, set[int](), set[int]()
        for k, part in enumerate(parts):
            a, f, l = self.of(part)
            a = a or k >= required
            for p in last:
                self.follow[p] |= f
            first = first | f if nullable else first
            last = last | l if a else l
            nullable = nullable and a
        return nullable, first, last


def _ambiguous(states: list[set[int]], chars: list[int]) -> bool:
    """Does some state have two successors that one character leads to?"""
    for succ in states:
        seen = 0
        for p in succ:
            if chars[p] & seen:
                return True
            seen |= chars[p]
    return False


#: how many repetitions in a row may take the same characters: with k, a text that almost matches
#: costs PCRE2 about n^k steps (n its length); measured with 8 hostile clients and 8000-character
#: paths, two in a row (`.*x.*x`) already held another tenant's requests for 0.2-0.5 s
#: (docs/gateway.md). A final `.*` does not count: once there, nothing can fail (`/api/.*/items/.*`)
MAX_OVERLAPPING = 1


def _overlapping_chain(value: str, tree: _Node) -> str | None:
    """Repetitions in a row that can all take one text: `\\d+\\d+\\d+x`, `.*x.*x.*x`, `a*a*a*b`
    (their number is the power of the length that a backtracking match may take). Two
    repetitions p, q (single characters that repeat, `x*`, `.+`, `[a-z]{2,}`) are in a row when a
    text of characters that both can take leads from p to q through the expression."""
    pos = _Positions()
    _, _, last = pos.of(tree)
    anything = _ALL & ~_bits("\n")
    loops = sorted(p for p in pos.loop_of  # a final repetition of any character accepts whatever is left
                   if not (p in last and pos.follow[p] <= {p} and pos.chars[p] & anything == anything))
    if len(loops) > 64:
        return f"it has {len(loops)} repetitions; this gateway takes at most 64"
    after: dict[int, list[int]] = {p: [] for p in loops}
    for p in loops:
        for q in loops:
            shared = pos.chars[p] & pos.chars[q]
            if q == p or not shared:
                continue
            seen, todo = set(), [r for r in pos.follow[p] if r != p]
            while todo:
                r = todo.pop()
                if r in seen or not pos.chars[r] & shared:
                    continue
                seen.add(r)
                todo.extend(pos.follow[r])
            if q in seen:
                after[p].append(q)
    longest: dict[int, list[int]] = {}
    visiting: set[int] = set()

    def chain(p: int) -> list[int]:
        if p in longest:
            return longest[p]
        if p in visiting:  # repetitions around them: as many in a row as the text is long
            return [p] * (MAX_OVERLAPPING + 1)
        visiting.add(p)
        best = max((chain(q) for q in after[p]), key=len, default=[])
        visiting.discard(p)
        longest[p] = [p] + best
        return longest[p]

    worst = max((chain(p) for p in loops), key=len, default=[])
    if len(worst) <= MAX_OVERLAPPING:
        return None
    spans = [pos.loop_of[p] for p in worst]
    parts = ", ".join(f"`{value[a:b]}`" + (f" ({spans.count((a, b))} times)" if spans.count((a, b)) > 1 else "")
                      for a, b in dict.fromkeys(spans))
    return (f"overlapping repetition: {parts} one after the other can take the same characters, so a text "
            f"that almost matches costs NGINX's backtracking matcher (PCRE2) time growing with the power "
            f"{len(worst)} of its length (RE2 would not): make them take different characters (e.g. `.*x.*x` as "
            "`[^x]*x[^x]*x`, `\\d+\\d+` as `\\d{2,}`)")


def repetition_problem(value: str) -> str | None:
    """Why `value` (valid RE2) has a repetition a backtracking matcher may take exponential time
    over (see above), naming the part; None when it has none."""
    try:
        tree = _Reader(value).parse()
    except _Unsure as e:
        return f"this gateway cannot tell how NGINX's backtracking matcher would run it ({e})"
    except (ValueError, IndexError):
        return "this gateway cannot tell how NGINX's backtracking matcher would run it"
    stack = [tree]
    while stack:
        n = stack.pop()
        stack.extend(n.parts)
        if n.kind != "rep" or not (n.max is None or n.max > UNROLLED):
            continue  # a repetition of at most UNROLLED times is checked as copies, inside any around it
        inner = _Positions()
        nullable, first, last = inner.of(n.parts[0])
        part = value[n.span[0]:n.span[1]]
        if nullable:
            return (f"`{part}` repeats a part that can match the empty text; NGINX's backtracking matcher (PCRE2) "
                    "may take exponential time on it, RE2 would not: make the repeated part match at least one character")
        starts = 0
        for q in first:
            starts |= inner.chars[q]
        # at the end of an iteration a character either continues it or starts the next one, never both
        ends_overlap = any(inner.chars[q] & starts for p in last for q in inner.follow[p])
        states = [first] + [inner.follow[p] | (first if p in last else set()) for p in range(len(inner.chars))]
        if ends_overlap or _ambiguous(states, inner.chars):
            return (f"nested or overlapping repetition in `{part}`: a text can match it in more than one way, which "
                    "NGINX's backtracking matcher (PCRE2) may take exponential time to try (RE2 would not); write it "
                    "so that each character continues the repetition in one way only, e.g. `(a|aa)+` as `a+`, "
                    "`(ab|ac)+` as `(a(b|c))+`, `([a-z]+-?)+` as `[a-z]+(-[a-z]+)*`")
    return _overlapping_chain(value, tree)
