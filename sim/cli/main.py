"""``sim``'s parser and dispatch.

Each module of this package adds its sub-commands (``add_parser(s)``) and sets ``func`` on
them; :func:`main` parses, calls it, and turns the library's ``ValueError``/``TypeError``
(which name the field and value) into one line on stderr and exit status 2 — no traceback.
A bad flag value is argparse's error (status 2 as well)."""

from __future__ import annotations

import argparse
import sys

from . import device, info, run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sim", description="LLM-serving simulator")
    sub = parser.add_subparsers(dest="command")
    run.add_parser(sub)
    info.add_parsers(sub)
    device.add_parsers(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"sim {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
