"""A fast way to read YAML that gives exactly what PyYAML's safe loader gives, or declines.

rapidyaml (C++) parses the text and emits it as JSON, which orjson turns into Python objects:
about ten times faster than PyYAML's C loader. But rapidyaml reads YAML 1.2 and PyYAML (like
the go-yaml v2 behind kubectl) reads YAML 1.1, and JSON cannot say what a YAML node was written
as. So the fast path only takes text in which nothing can be read differently:

- no anchors, aliases, tags, merge keys, directives, complex keys or folded (`>`) block scalars;
- no plain (unquoted) scalar that YAML 1.1 reads as a boolean, null, number or timestamp other
  than the forms both read alike (`true`, `false`, `null`, `12`, `-3`, `1.5` as values);
- no plain scalar that rapidyaml rewrites (`inf`, `nan`) or reads as a number where PyYAML
  reads text (`1e3`);
- no tab, carriage return, byte order mark, YAML 1.1 line break (NEL, LS, PS), character
  PyYAML refuses, or backslash escape other than `\\\\`, `\\"`, `\\n` and `\\t`;
- text that rapidyaml parses and whose JSON orjson accepts (64-bit integers, nesting within
  orjson's limit);
- no duplicate key in a mapping: rapidyaml's JSON keeps both, orjson keeps the last. A key in
  JSON ends in `":` (a quote inside a string is escaped), so the keys of rapidyaml's JSON are
  counted against those of orjson's objects written again: one dropped key makes the second
  count smaller (by the keys below it too), and the text goes to PyYAML, which reports it.

Anything else returns None and the caller reads the text with PyYAML, which also gives the
`file:line` of any error. The scan is conservative: it may decline text that would have read
the same (a quoted `"[1, no]"`, say), never the reverse. tests/files/test_yamlfast.py compares both
readers on the shared scenarios, the examples, synthetic clusters and generated documents.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

import orjson

try:
    import ryml  # type: ignore[import-untyped]  # rapidyaml ships neither stubs nor py.typed
except ImportError:  # pragma: no cover - rapidyaml has wheels for the usual platforms; PyYAML reads all
    ryml = None

#: plain scalars that YAML 1.1 or rapidyaml reads as something other than the same text
_TOKEN = "|".join([
    r"[-+]?\.?(?:inf|Inf|INF|nan|NaN|NAN)",  # rapidyaml writes `inf` as `.inf`
    r"yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF|True|TRUE|False|FALSE|Null|NULL|~|=|<<",
    r"[-+]?[0-9_.]*[0-9_][0-9_.]*(?:[eE][-+]?[0-9_]*)?",  # decimal, octal, `1_000`, exponents
    r"[-+]?0[xXoObB][0-9a-fA-F_]+",
    r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?",  # sexagesimal
    r"[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?(?:[Tt \t][^\n#,\]}]*)?",  # timestamp
])
_SAFE_VALUE = r"(?:-?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]+)?|true|false|null)"  # read alike by both, as values (orjson reads a longer integer as a float)
_END = r"[ \t]*(?:$|\#|[,\]}])"
_FIRST = r"-+.0-9_~=<yYnNoOtTfFiI"  # the characters those plain scalars start with

#: each pattern starts with a character class or literal, so that re skips ahead quickly
_RISKY = [re.compile(p, re.MULTILINE) for p in (
    # a character PyYAML refuses or reads as a line break, tabs, carriage returns, a byte order mark
    r"[^\n\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]",
    r"\\[^\\\"nt]",  # escapes other than the four both surely read alike
    # anchor, alias, tag, complex key, directive or reserved indicator (`@`, backquote): rapidyaml
    # reads some of these as plain text where PyYAML refuses them
    r"[&*!?@`%](?<![^\s\[{,\]}][&*!?@`%])",  # (also right after a closing bracket)
    r"['\"][&!@`%]",  # and right after a quote (not `*` or `?`: `'*.example.com'` is common)
    # directive, document end (indented, too), an indented `---`, a document that is a block scalar
    r"\n(?:%|[ \t]*\.\.\.|[ \t]+---|(?:---[ \t]+)?[|>])",
    # after `key: `: a folded block scalar, a literal one with an indentation indicator, or a plain
    # value that is not one of the forms both read alike (a hyphen is too common to start from:
    # list items are checked from the start of their line, below)
    rf":[ \t]++(?:>|\|[^\s#]*[0-9]|(?=[{_FIRST}])(?:(?:{_TOKEN}|true|false|null)[ \t]*:(?:[ \t]|$)|(?!{_SAFE_VALUE}{_END})(?:{_TOKEN})(?={_END})))",
    # the same in flow context, and flow content of the form `a:b` (YAML 1.1 and 1.2 differ there)
    # and a flow collection continued on the next line (PyYAML refuses keys there)
    rf"[\[{{,](?:[ \t]*+(?:(?=[{_FIRST}])(?:(?:{_TOKEN}|true|false|null)[ \t]*:(?:[ \t]|$)|(?!{_SAFE_VALUE}{_END})(?:{_TOKEN})(?={_END}))|[^\s\]}}#'\"][^\n:]*:[^\s])|(?<=[\[{{])[^\n\]}}]*\n)",
    # at the start of a line (after `- `s): the block scalars above, a plain key that YAML 1.1
    # resolves (PyYAML reads a non-string), or a plain value (a list item, or on a line of its own)
    rf"\n[ \t]*+(?:-[ \t]++)*+(?:>|\|[^\s#]*[0-9]|(?=[{_FIRST}])(?:(?:{_TOKEN}|true|false|null)[ \t]*:(?:[ \t]|$)|(?!{_SAFE_VALUE}{_END})(?:{_TOKEN}){_END}))",
)]  # the text is searched with a newline before it, so that `\n` also finds the first line


#: an empty key, or a plain scalar starting with a closing bracket (`[]` and `{}` pass): rapidyaml
#: reads them, PyYAML refuses them. Literals, found by the fast substring search.
_RISKY_LITERALS = (" :", "\n:", "[:", "{:", ",:", " ]", " }", "\n]", "\n}")
_FLOW_COMMENT = re.compile(r"[\[{][^\n]*[ \t]#")  # PyYAML ends a flow collection's line at a comment
_QUOTED_KEY = re.compile(r"[\"'][ \t]*:(?:[ \t]|$)", re.MULTILINE)
#: a quoted key whose quotes open on an earlier line: PyYAML refuses a key of two lines
_MULTILINE_KEY = re.compile(r"\n[ \t]*+(?:-[ \t]++)*+[^\s\"'#][^\n]*[\"'][ \t]*:(?:[ \t]|$)", re.MULTILINE)


def risky(text: str) -> bool:
    """Whether `text` holds anything the fast path could read differently from PyYAML.

    Every check below looks within one line (a line start is seen as the newline before it), so
    the text's distinct lines are checked once each: manifests repeat most of their lines
    (`kind: HTTPRoute`, `group: gateway.networking.k8s.io`), and at 20k routes the 1.05 million
    lines are 106 thousand distinct ones, a seventh of the text. The lines are split at `\\n`
    only, so that any other line break stays inside a line and is caught as a character.
    """
    lines = set(text.split("\n"))
    lines.discard("")  # (an empty line matches no check)
    return _risky_lines("\n" + "\n".join(lines) + "\n")


def _risky_lines(text: str) -> bool:
    """The checks, on text that starts with a newline (so that `\\n` also finds the first line)."""
    if any(s in text for s in _RISKY_LITERALS):
        return True
    if " #" in text and _FLOW_COMMENT.search(text):
        return True
    if _QUOTED_KEY.search(text) and _MULTILINE_KEY.search(text):
        return True
    return any(p.search(text) for p in _RISKY)


_STDERR_LOCK = threading.Lock()


def load_all(text: str) -> list[Any] | None:
    """The documents of `text` as `yaml.load_all(text, SafeLoader)` reads them, or None to use PyYAML."""
    if ryml is None or not text.endswith("\n") or risky(text):
        return None  # (a block scalar at the very end reads with its line break in rapidyaml only)
    try:
        with _STDERR_LOCK:
            json_text = parse_to_json(bytearray(text.encode("utf-8")))
        if json_text is None:  # nothing but comments and blank lines
            return [] if not text.strip() or _only_comments(text) else None
        json_bytes, stream = json_text
        docs = orjson.loads(json_bytes)
        if not stream:
            docs = [docs]
        # (the view is over the bytearray parse_to_json was given; `obj` is typed as any buffer)
        if json_bytes.obj.count(b'":', 0, len(json_bytes)) != orjson.dumps(docs).count(b'":'):  # type: ignore[attr-defined]
            return None  # a duplicate key, which orjson drops: PyYAML's reading names it (load.py)
    except Exception:  # noqa: BLE001 - any failure of the fast path means: let PyYAML read it (and report)
        return None
    return docs


def parse_to_json(source: bytearray) -> tuple[memoryview, bool] | None:
    """rapidyaml's JSON for the UTF-8 text in `source` (which it parses in place), and whether it
    is a stream (a list of documents); None for no content. Its parse errors go to /dev/null.
    (Also the benchmark's "fastest parse", without the scan and the checks.)

    rapidyaml parses the text in place (its tree points into the buffer) into a tree made large
    enough beforehand (a node per line and a quarter more: block-style manifests have about 1.2;
    a tree that grows doubles, copying itself, and ends larger: 0.43 s -> 0.21 s at 20k routes,
    2.1 -> 1.3 million nodes of capacity for 1.2 million used), and writes its JSON into a
    buffer sized from the text (JSON of YAML is about twice as long; a short guess is told the
    size and tried once more), which orjson reads without a copy.

    rapidyaml prints a parse error on file descriptor 2 before raising; PyYAML then reports the
    error properly, so the fast path's message is silenced for the length of the parse (anything
    another thread writes there meanwhile is lost too: the callers are the command line and the
    sandbox's seeding at start, both single-threaded then).
    """
    saved = os.dup(2)
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 2)
        finally:
            os.close(null)
        tree = ryml.Tree()
        tree.reserve(source.count(b"\n") * 5 // 4 + 16)
        ryml.parse_in_place(source, tree)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    root = tree.root_id()
    out = bytearray(2 * len(source) + 4096)
    failed, size = ryml.emit_json_to_substr(tree, root, out)
    if failed:
        out = bytearray(size)
        failed, size = ryml.emit_json_to_substr(tree, root, out)
        if failed:  # pragma: no cover - the size rapidyaml asked for
            return None
    if size == 0:
        return None
    return memoryview(out)[:size], tree.is_stream(root)


def _only_comments(text: str) -> bool:
    return all(not s or s.startswith("#") for s in (line.strip() for line in text.splitlines()))
