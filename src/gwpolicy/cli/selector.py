"""kubectl's label selector (`-l/--selector`): `=`, `==`, `!=`, `in`, `notin`, `key`, `!key`, `<`, `>`.

The grammar and rules are those of k8s.io/apimachinery's labels.Parse: requirements joined by commas
are ANDed; `!=` and `notin` also match objects without the key; `<`/`>` take an integer and need the
key with an integer value. Parsing is pure; a bad selector is a SelectorError naming what is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SPECIAL = "(),=!<>"


class SelectorError(ValueError):
    """A selector that kubectl would refuse; the message says which part and why."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "<", ">"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if self.op in ("=", "in"):
            return has and value in self.values
        if self.op in ("!=", "notin"):
            return not has or value not in self.values
        # "<" / ">": both sides integers, as kubectl compares them
        try:
            have, want = int(str(value)), int(self.values[0])
        except (TypeError, ValueError):
            return False
        return have < want if self.op == "<" else have > want


@dataclass(frozen=True)
class Selector:
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels if isinstance(labels, Mapping) else {}
        return all(r.matches(labels) for r in self.requirements)


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c.isspace():
            i += 1
        elif text.startswith(("==", "!="), i):
            out.append(text[i:i + 2])
            i += 2
        elif c in _SPECIAL:
            out.append(c)
            i += 1
        else:
            j = i
            while j < len(text) and not text[j].isspace() and text[j] not in _SPECIAL:
                j += 1
            out.append(text[i:j])
            i = j
    return out


def check_key(key: str) -> None:
    """A label key: `[prefix/]name`, name at most 63 characters, prefix a DNS subdomain."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and not prefix:
        raise SelectorError(f"invalid label key {key!r}: the prefix before '/' is empty")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        raise SelectorError(f"invalid label key {key!r}: the prefix must be a lowercase DNS subdomain")
    if not name or len(name) > 63 or not _NAME.fullmatch(name):
        raise SelectorError(f"invalid label key {key!r}: a name of at most 63 characters, alphanumeric, "
                            "'-', '_' or '.' inside, alphanumeric at both ends")


def check_value(value: str) -> None:
    if value and (len(value) > 63 or not _NAME.fullmatch(value)):
        raise SelectorError(f"invalid label value {value!r}: at most 63 characters, alphanumeric, "
                            "'-', '_' or '.' inside, alphanumeric at both ends")


def parse_selector(text: str) -> Selector:
    """`app=web,tier in (fe,be),!legacy` -> Selector; raises SelectorError."""
    toks = _tokens(text)
    reqs: list[Requirement] = []
    i = 0

    def want_value(pos: int) -> str:
        tok = toks[pos] if pos < len(toks) else ""
        if tok in ("(", ")", "=", "==", "!=", "!", "<", ">"):
            raise SelectorError(f"expected a value after {toks[pos - 1]!r}, found {tok!r}")
        if tok == ",":
            return ""
        check_value(tok)
        return tok

    while i < len(toks):
        if toks[i] == "!":
            if i + 1 >= len(toks) or toks[i + 1] in _SPECIAL or toks[i + 1] in ("==", "!="):
                raise SelectorError("'!' must be followed by a label key")
            check_key(toks[i + 1])
            reqs.append(Requirement(toks[i + 1], "!"))
            i += 2
        else:
            key = toks[i]
            if key in _SPECIAL or key in ("==", "!="):
                raise SelectorError(f"expected a label key, found {key!r}")
            check_key(key)
            op = toks[i + 1] if i + 1 < len(toks) else ","
            if op == ",":
                reqs.append(Requirement(key, "exists"))
                i += 1
            elif op in ("=", "==", "!="):
                value = want_value(i + 2) if i + 2 < len(toks) else ""
                consumed = 1 if i + 2 < len(toks) and toks[i + 2] != "," else 0
                reqs.append(Requirement(key, "!=" if op == "!=" else "=", (value,)))
                i += 2 + consumed
            elif op in ("<", ">"):
                value = toks[i + 2] if i + 2 < len(toks) else ""
                if not re.fullmatch(r"-?\d+", value):
                    raise SelectorError(f"{key}{op}{value}: '{op}' takes an integer")
                reqs.append(Requirement(key, op, (value,)))
                i += 3
            elif op in ("in", "notin"):
                if i + 2 >= len(toks) or toks[i + 2] != "(":
                    raise SelectorError(f"'{key} {op}' must be followed by a list of values in parentheses")
                j = i + 3
                values: list[str] = []
                expect_value = True
                while True:
                    if j >= len(toks):
                        raise SelectorError(f"'{key} {op} (' has no closing ')'")
                    tok = toks[j]
                    if tok == ")":
                        if expect_value and values:
                            values.append("")
                        break
                    if tok == ",":
                        if expect_value:
                            values.append("")
                        expect_value = True
                    elif tok in _SPECIAL or tok in ("==", "!="):
                        raise SelectorError(f"unexpected {tok!r} in the values of '{key} {op}'")
                    else:
                        if not expect_value:
                            raise SelectorError(f"values of '{key} {op}' must be separated by commas")
                        check_value(tok)
                        values.append(tok)
                        expect_value = False
                    j += 1
                if not values:
                    raise SelectorError(f"'{key} {op} ()' needs at least one value")
                reqs.append(Requirement(key, op, tuple(values)))
                i = j + 1
            else:
                raise SelectorError(f"expected an operator (=, ==, !=, in, notin, <, >) after {key!r}, found {op!r}")
        if i < len(toks):
            if toks[i] != ",":
                raise SelectorError(f"expected ',' between requirements, found {toks[i]!r}")
            i += 1
            if i >= len(toks):
                raise SelectorError("a ',' must be followed by a requirement")
    return Selector(tuple(reqs))
