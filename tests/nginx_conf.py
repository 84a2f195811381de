"""A small parser of NGINX's configuration syntax, for tests: the rendered files as a tree of
directives, read the way NGINX 1.22's ngx_conf_read_token reads them.

Written for the tests rather than taken from PyPI: crossplane (the known Python parser) has had no
release since 2022 and splits words on Python's `str.isspace()`, which also takes vertical tab,
form feed and the Unicode spaces, where NGINX splits only on space, tab, CR and LF: it would read
a hostile string differently from NGINX, which is exactly what these tests look at.

NGINX's rules, as implemented here:
- words are separated by space, tab, CR and LF; `;` ends a directive, `{` opens its block, `}`
  closes one (only where a word starts: inside a word, `}` is an ordinary character);
- `#` starts a comment only where a word would start, and the comment runs to the next LF;
- a word starting with `"` or `'` runs to the same quote; a backslash escapes the next character
  (in quoted and plain words alike); in the word's value `\\"`, `\\'` and `\\\\` lose the backslash,
  `\\t`, `\\r` and `\\n` become the control character, any other escape is kept as written;
- `${` inside a word (a variable in braces) does not open a block.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass


class ConfSyntaxError(ValueError):
    pass


@dataclass
class Directive:
    name: str
    args: list[str]
    quoted: list[bool]  # per argument: was it written as a quoted string
    block: list["Directive"] | None = None
    file: str = ""
    line: int = 0
    name_quoted: bool = False  # a map's or split_clients' entry may start with a quoted string

    def walk(self, path: tuple[str, ...] = ()) -> "list[tuple[tuple[str, ...], Directive]]":
        """(the names of the enclosing blocks, directive) of this directive and all below it."""
        out = [(path, self)]
        for d in self.block or []:
            out += d.walk(path + (self.name,))
        return out


_SPACE = " \t\r\n"


def _unescape(raw: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == "\\" and i + 1 < len(raw):
            n = raw[i + 1]
            if n in "\"'\\":
                out.append(n)
                i += 2
                continue
            if n in "trn":
                out.append({"t": "\t", "r": "\r", "n": "\n"}[n])
                i += 2
                continue
        out.append(c)
        i += 1
    return "".join(out)


def tokens(text: str, file: str = "") -> list[tuple[str, object, bool, int]]:
    """(kind, value, quoted, line): kind is `word`, `;`, `{` or `}`."""
    out: list[tuple[str, object, bool, int]] = []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c in _SPACE:
            line += c == "\n"
            i += 1
            continue
        if c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if c in ";{}":
            out.append((c, c, False, line))
            i += 1
            continue
        start_line = line
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                if text[j] == "\\":
                    j += 1
                j += 1
            if j >= n:
                raise ConfSyntaxError(f"{file}:{start_line}: unterminated {c} string")
            raw = text[i + 1:j]
            line += raw.count("\n")
            i = j + 1
            if i < n and text[i] not in _SPACE + ";{" and text[i] != ")":
                raise ConfSyntaxError(f"{file}:{line}: unexpected {text[i]!r} after a quoted string")
            out.append(("word", _unescape(raw), True, start_line))
            continue
        j = i
        variable = False
        while j < n:
            ch = text[j]
            if ch == "\\":
                j += 2
                variable = False
                continue
            if ch == "{" and variable:
                j += 1
                continue
            if ch in _SPACE or ch in ";{":
                break
            variable = ch == "$"
            j += 1
        raw = text[i:j]
        line += raw.count("\n")
        out.append(("word", _unescape(raw), False, start_line))
        i = j
    return out


def parse(text: str, file: str = "") -> list[Directive]:
    toks = tokens(text, file)
    pos = 0

    def block(depth: int) -> list[Directive]:
        nonlocal pos
        items: list[Directive] = []
        words: list[tuple[str, bool, int]] = []
        while pos < len(toks):
            kind, value, quoted, line = toks[pos]
            pos += 1
            if kind == "word":
                words.append((str(value), quoted, line))
            elif kind == ";":
                if not words:
                    raise ConfSyntaxError(f"{file}:{line}: unexpected ';'")
                items.append(Directive(words[0][0], [w for w, _, _ in words[1:]], [q for _, q, _ in words[1:]],
                                       None, file, words[0][2], words[0][1]))
                words = []
            elif kind == "{":
                if not words:
                    raise ConfSyntaxError(f"{file}:{line}: unexpected '{{'")
                d = Directive(words[0][0], [w for w, _, _ in words[1:]], [q for _, q, _ in words[1:]], None, file,
                              words[0][2], words[0][1])
                words = []
                d.block = block(depth + 1)
                items.append(d)
            else:  # }
                if words:
                    raise ConfSyntaxError(f"{file}:{line}: unexpected '}}'")
                if depth == 0:
                    raise ConfSyntaxError(f"{file}:{line}: unexpected '}}'")
                return items
        if words or depth:
            raise ConfSyntaxError(f"{file}: unexpected end of file")
        return items

    return block(0)


def parse_files(files: dict[str, bytes], main: str = "nginx.conf") -> list[Directive]:
    """The configuration as NGINX reads it from `main`: `include` replaced by the included files'
    directives (relative to the prefix, globs as NGINX expands them, in sorted order)."""

    def expand(items: list[Directive]) -> list[Directive]:
        out: list[Directive] = []
        for d in items:
            if d.name == "include" and d.block is None and len(d.args) == 1:
                for name in sorted(f for f in files if fnmatch.fnmatchcase(f, d.args[0])):
                    out += expand(parse(files[name].decode("latin-1"), name))
                continue
            if d.block is not None:
                d.block = expand(d.block)
            out.append(d)
        return out

    return expand(parse(files[main].decode("latin-1"), main))


def unquoted_words(d: Directive) -> list[str]:
    """The directive's name and arguments that were not written as quoted strings."""
    return ([] if d.name_quoted else [d.name]) + [a for a, q in zip(d.args, d.quoted) if not q]


def shape(items: list[Directive]) -> list[object]:
    """The directives without their arguments' text: name (a quoted one as `"..."`), number of
    arguments and block shape, each block's directives sorted (content-addressed names and sorted
    maps may reorder them)."""
    def one(d: Directive) -> object:
        name = '"..."' if d.name_quoted else d.name  # a map's key written as a string: data, not a directive
        return (name, len(d.args), None if d.block is None else tuple(sorted(map(repr, map(one, d.block)))))
    return sorted(map(repr, map(one, items)))
