"""`gwpolicy` entry point: kubectl-like flags, errors on stderr, exit codes (0 ok, 1 error)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from gwpolicy import __version__
from gwpolicy.analysis import Analysis, analyse
from gwpolicy.load import LoadError, load_paths
from gwpolicy.output import effective_list, encode, status_list
from gwpolicy.status import DEFAULT_CONTROLLER


class CliError(Exception):
    """A user-facing error: printed as `Error: ...` on stderr, exit code 1."""


def _common(p: argparse.ArgumentParser, formats: Sequence[str]) -> None:
    p.add_argument("-f", "--filename", action="append", default=[], metavar="FILE|DIR|-",
                   help="manifests to analyse (repeatable; a directory is read recursively; - is stdin)")
    p.add_argument("-n", "--namespace", help="only objects in this namespace (also the namespace of "
                   "namespaced objects that name none)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="objects in every namespace (the default for files)")
    p.add_argument("-o", "--output", default=formats[0], choices=formats, help="output format")
    p.add_argument("--controller-name", default=DEFAULT_CONTROLLER, help="controllerName of our status entries")
    p.add_argument("--now", default=os.environ.get("GWPOLICY_NOW"),
                   help="time to write as lastTransitionTime (default: now; for reproducible output)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gwpolicy", description="Gateway API policy attachment: "
                                     "effective policy, status and blast radius of policies.")
    parser.add_argument("--version", action="version", version=f"gwpolicy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("effective", help="effective policy of every object, path and policy kind (S9)")
    _common(p, ("json", "yaml"))
    p = sub.add_parser("status", help="status the controller would write (S9)")
    _common(p, ("json", "yaml"))
    return parser


def load_analysis(args: argparse.Namespace) -> Analysis:
    if not args.filename:
        raise CliError("no input: give manifests with -f FILE|DIR|- (reading a live cluster needs the controller issue)")
    loaded = load_paths(args.filename)
    for w in loaded.warnings:
        print(f"Warning: {w}", file=sys.stderr)
    a = analyse(loaded.objects, loaded.origins, default_namespace=args.namespace or "default",
                controller=args.controller_name, now=args.now)
    for w in a.warnings:
        print(f"Warning: {w}", file=sys.stderr)
    return a


def _scope(args: argparse.Namespace) -> str | None:
    return None if args.all_namespaces else args.namespace


def cmd_effective(args: argparse.Namespace) -> int:
    a = load_analysis(args)
    sys.stdout.buffer.write(encode(effective_list(a, _scope(args)), args.output))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    a = load_analysis(args)
    sys.stdout.buffer.write(encode(status_list(a, _scope(args)), args.output))
    return 0


COMMANDS = {"effective": cmd_effective, "status": cmd_status}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return 1
    try:
        return COMMANDS[args.command](args)
    except (LoadError, CliError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
