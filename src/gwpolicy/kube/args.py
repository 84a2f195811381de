"""kubectl's conventions for every command line of gwpolicy (the CLI, the controller, the webhook, the
sandbox, the benchmark): a bad flag prints the command's own usage, `Error: ...` and where help is, and
exits 1; defaults are shown in help; `kubectl gwpolicy` is the name when run as the plugin."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from gwpolicy.engine.names import is_label


def program_name(argv0: str | None = None) -> str:
    """`kubectl gwpolicy` when run as the kubectl plugin (argv[0] is kubectl-gwpolicy), else `gwpolicy`."""
    base = os.path.basename(argv0 if argv0 is not None else (sys.argv[0] if sys.argv else ""))
    return "kubectl gwpolicy" if base.startswith("kubectl-gwpolicy") else "gwpolicy"


class Parser(argparse.ArgumentParser):
    """kubectl's way with a bad flag: the command's own usage, `Error: ...`, where help is, exit 1."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(1, f"Error: {message}\nSee '{self.prog} --help' for usage and examples.\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Examples kept as written; a flag's default shown when it has one worth saying."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        nothing = default is None or default is False or default is argparse.SUPPRESS or default in ([], "")
        if "%(default)" not in text and action.option_strings and not nothing:
            text += " (default: %(default)s)"
        return text


def positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number")
    return value


def namespace_name(text: str) -> str:
    """A namespace's name (a DNS-1123 label), for a flag that takes one (`--from`, the mesh's `--namespace`)."""
    if not is_label(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a namespace name (a DNS-1123 label: at most 63 lower case "
                                         "letters, digits and '-', starting and ending with a letter or digit)")
    return text
