"""Shell completion: `gwpolicy completion bash|zsh` and the `__complete` protocol kubectl uses.

kubectl (cobra) completes by running the program as `PROG __complete WORDS... CURRENT` and reading
one candidate a line, then `:DIRECTIVE` (4: no file completion, 0: the shell may complete files).
gwpolicy speaks the same protocol, so the scripts below are short, `kubectl gwpolicy <TAB>` works
through kubectl's own completion (kubectl runs `kubectl_complete-gwpolicy`), and candidates come
from the parser itself: commands, flags, output formats, types, and names read from the `-f` files
(or the cluster when there are none), as kubectl completes names from the server.
argcomplete and shtab were not used: neither speaks kubectl's plugin protocol, and shtab's scripts
are static, so names could not come from the manifests.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from typing import Any, Sequence

DIRECTIVE_DEFAULT = 0  # the shell may fall back to file names
DIRECTIVE_NO_SPACE = 2
DIRECTIVE_NO_FILES = 4

#: commands whose first positional is a type or TYPE/NAME (get and describe also take TYPE NAME)
TYPED_COMMANDS = ("get", "describe", "explain", "impact")
TYPED_FLAGS = {"--delete"}
FILE_FLAGS = {"-f", "--filename", "--apply", "--kubeconfig"}
SPECIAL_TYPES = ("policies", "policykinds")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {opt: a for a in parser._actions for opt in a.option_strings}


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


class _Words:
    """The flags and positionals typed so far, read as argparse would (enough for completion)."""

    def __init__(self, words: Sequence[str], flags: dict[str, argparse.Action]) -> None:
        self.values: dict[str, list[str]] = {}
        self.seen: set[str] = set()
        self.positionals: list[str] = []
        i = 0
        while i < len(words):
            w = words[i]
            if w.startswith("-") and w != "-":
                opt, eq, val = w.partition("=")
                action = flags.get(opt)
                if action is not None:
                    self.seen.add(action.dest)
                if action is not None and _takes_value(action):
                    if not eq:
                        i += 1
                        val = words[i] if i < len(words) else ""
                    self.values.setdefault(action.dest, []).append(val)
            else:
                self.positionals.append(w)
            i += 1

    def last(self, dest: str) -> str | None:
        """The value of a flag given last (as argparse keeps the last), or None."""
        given = self.values.get(dest)
        return given[-1] if given else None


def _analysis(words: "_Words") -> Any:
    """The analysis of the -f files (or the cluster), quietly: completion must never print errors."""
    from gwpolicy.cli.loading import load_analysis
    from gwpolicy.cli.parser import build_parser
    from gwpolicy.kube.kubeconfig import context_namespace

    kubeconfig, context = words.last("kubeconfig"), words.last("context")
    namespace = words.last("namespace") or context_namespace(kubeconfig, context)
    args = build_parser().parse_args(["graph"])
    args.filename = words.values.get("filename") or None
    args.kubeconfig, args.context = kubeconfig, context
    with contextlib.redirect_stderr(io.StringIO()):
        a, _ = load_analysis(args, namespace)
    return a, namespace


def _type_names(a: Any) -> list[str]:
    from gwpolicy.cli.resources import known_types

    plurals = sorted({rt.plural.lower() for rt in known_types(a).values()})
    return list(SPECIAL_TYPES) + [p for p in plurals if p not in SPECIAL_TYPES]


def _names_of(a: Any, type_text: str, namespace: str, all_ns: bool) -> list[str]:
    from gwpolicy.cli.resources import resolve_type

    low = type_text.lower()
    if low in ("policies", "policy", "pol"):
        refs = list(a.policies)
    elif low in ("policykinds", "policykind"):
        from gwpolicy.engine.kinds import plural_of
        return sorted(f"{plural_of(k.kind)}.{k.group}" for k in a.kinds.values())
    else:
        rt = resolve_type(type_text, a)
        if rt.kind == "Namespace" and rt.group == "":
            return sorted(a.index.namespaces)
        refs = [o.ref for o in a.index.of_kind(rt.group, rt.kind)]
    return sorted({r.name for r in refs if all_ns or r.namespace is None or r.namespace == namespace})


def candidates(words: Sequence[str]) -> tuple[list[str], int]:
    """What may come next after `words` (the last one is the word being typed, maybe empty)."""
    from gwpolicy.cli.parser import build_parser

    parser = build_parser()
    *done, current = list(words) or [""]
    subs = _subparsers(parser)
    command = next((w for w in done if not w.startswith("-")), None)
    if command is None:
        if current.startswith("-"):
            return sorted(o for o in _flags(parser) if o.startswith("--")), DIRECTIVE_NO_FILES
        return sorted(subs), DIRECTIVE_NO_FILES
    sub = subs.get(command)
    if sub is None:
        return [], DIRECTIVE_NO_FILES
    flags = _flags(sub)
    rest = done[done.index(command) + 1:]
    prev = rest[-1] if rest else ""
    prev_action = flags.get(prev) if prev.startswith("-") else None
    if prev_action is not None and _takes_value(prev_action):
        return _flag_values(prev, prev_action, _Words(rest[:-1], flags))
    if current.startswith("-"):
        return sorted(o for o in flags if o.startswith(current) or o.startswith("--")), DIRECTIVE_NO_FILES
    state = _Words(rest, flags)
    positionals = [a for a in sub._actions if not a.option_strings and a.help is not argparse.SUPPRESS]
    if command == "completion":
        return (["bash", "zsh"] if not state.positionals else []), DIRECTIVE_NO_FILES
    if command not in TYPED_COMMANDS or not positionals:
        return [], DIRECTIVE_NO_FILES
    if command in ("explain", "impact") and state.positionals:
        return [], DIRECTIVE_NO_FILES  # FIELD: free text
    return _typed(state, current, more_names=command == "get" or (command == "describe" and len(state.positionals) < 2))


def _typed(state: _Words, current: str, more_names: bool) -> tuple[list[str], int]:
    """TYPE, TYPE/NAME, or NAME after a TYPE."""
    try:
        a, namespace = _analysis(state)
    except Exception:  # noqa: BLE001 - no input to read: the built-in types, no names, never an error
        from gwpolicy.engine.analysis import analyse
        a, namespace = analyse([]), ""
    all_ns = "all_namespaces" in state.seen
    types = _type_names(a)
    try:
        if "/" in current:
            t = current.split("/", 1)[0]
            return [f"{t}/{n}" for n in _names_of(a, t, namespace, all_ns)], DIRECTIVE_NO_FILES
        if state.positionals and "/" not in state.positionals[0]:
            if not more_names:
                return [], DIRECTIVE_NO_FILES
            typed = set(state.positionals[1:])
            return [n for n in _names_of(a, state.positionals[0], namespace, all_ns) if n not in typed], DIRECTIVE_NO_FILES
    except Exception:  # noqa: BLE001 - an unknown type has no names
        return [], DIRECTIVE_NO_FILES
    if state.positionals and "/" in state.positionals[0]:
        return [f"{t}/" for t in types], DIRECTIVE_NO_FILES | DIRECTIVE_NO_SPACE
    return types, DIRECTIVE_NO_FILES


def _flag_values(flag: str, action: argparse.Action, state: _Words) -> tuple[list[str], int]:
    if action.choices:
        return [str(c) for c in action.choices], DIRECTIVE_NO_FILES
    if flag in ("-o", "--output"):
        from gwpolicy.cli.parser import GET_FORMATS
        return list(GET_FORMATS) + ["jsonpath=", "custom-columns="], DIRECTIVE_NO_FILES
    if flag in FILE_FLAGS:
        return [], DIRECTIVE_DEFAULT
    if flag in ("-n", "--namespace", "--from"):
        try:
            a, _ = _analysis(state)
        except Exception:  # noqa: BLE001
            return [], DIRECTIVE_NO_FILES
        return sorted(a.index.namespaces), DIRECTIVE_NO_FILES
    if flag == "--context":
        from gwpolicy.kube.kubeconfig import load_kubeconfig
        cfg = load_kubeconfig(state.last("kubeconfig"))
        return [c["name"] for c in cfg.get("contexts") or [] if isinstance(c, dict) and isinstance(c.get("name"), str)], \
            DIRECTIVE_NO_FILES
    if flag in TYPED_FLAGS:
        return _typed(state, "", more_names=False)
    return [], DIRECTIVE_NO_FILES


def complete_main(argv: Sequence[str]) -> int:
    """`gwpolicy __complete WORDS... CURRENT`: candidates a line, then `:DIRECTIVE`."""
    try:
        words, directive = candidates(argv)
    except Exception:  # noqa: BLE001 - a completion never ends in a traceback on the user's terminal
        words, directive = [], DIRECTIVE_NO_FILES
    current = argv[-1] if argv else ""
    text = "".join(f"{w}\n" for w in words if w.startswith(current)) + f":{directive}\n"
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    return 0


def plugin_main() -> int:
    """`kubectl_complete-gwpolicy`: kubectl runs it with the words after `kubectl gwpolicy`."""
    return complete_main(sys.argv[1:])


_BASH = r'''# bash completion for {prog}; load it with: source <({prog} completion bash)
_gwpolicy_complete() {{
    local line="${{COMP_LINE:0:COMP_POINT}}"
    local -a words
    read -ra words <<< "$line"
    [[ "$line" == *[[:space:]] || ${{#words[@]}} -eq 0 ]] && words+=("")
    local cur="${{words[${{#words[@]}}-1]}}"
    local out directive c
    out=$(command "${{words[0]}}" __complete "${{words[@]:1}}" 2>/dev/null) || return
    directive="${{out##*:}}"
    out="${{out%:*}}"
    COMPREPLY=()
    while IFS= read -r c; do
        [[ -n "$c" && "$c" == "$cur"* ]] && COMPREPLY+=("$c")
    done <<< "$out"
    if (( ${{#COMPREPLY[@]}} == 0 )) && (( (directive & 4) == 0 )); then
        compopt -o default 2>/dev/null
    fi
    if (( (directive & 2) != 0 )) || [[ ${{#COMPREPLY[@]}} -eq 1 && "${{COMPREPLY[0]}}" == */ ]] \
        || [[ ${{#COMPREPLY[@]}} -eq 1 && "${{COMPREPLY[0]}}" == *= ]]; then
        compopt -o nospace 2>/dev/null
    fi
}}
complete -F _gwpolicy_complete gwpolicy kubectl-gwpolicy
'''

_ZSH = r'''#compdef gwpolicy kubectl-gwpolicy
# zsh completion for {prog}; load it with: source <({prog} completion zsh) (after compinit)
_gwpolicy() {{
    local out directive
    local -a lines joined spaced
    out=$(${{words[1]}} __complete "${{(@)words[2,CURRENT]}}" 2>/dev/null) || return 1
    directive=${{out##*:}}
    lines=("${{(@f)${{out%:*}}}}")
    lines=(${{lines:#}})
    joined=(${{(M)lines:#*[/=]}})
    spaced=(${{lines:#*[/=]}})
    if (( ${{#lines}} == 0 )); then
        (( (directive & 4) == 0 )) && _files
        return
    fi
    (( ${{#joined}} )) && compadd -Q -S '' -- "${{joined[@]}}"
    if (( ${{#spaced}} )); then
        if (( (directive & 2) != 0 )); then compadd -Q -S '' -- "${{spaced[@]}}"; else compadd -Q -- "${{spaced[@]}}"; fi
    fi
}}
if [[ "$funcstack[1]" == _gwpolicy ]]; then _gwpolicy "$@"; else compdef _gwpolicy gwpolicy kubectl-gwpolicy; fi
'''


def script(shell: str, prog: str = "gwpolicy") -> str:
    """The completion script for `shell` (bash or zsh)."""
    return (_BASH if shell == "bash" else _ZSH).format(prog=prog)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(plugin_main())
