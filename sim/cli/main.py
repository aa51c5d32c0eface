"""``sim``'s parser and dispatch.

Each module of this package adds its sub-commands (``add_parser(s)``) and sets ``func`` on
them; :func:`main` parses and calls it. Every error the user can fix ends the same way: one
line on stderr, ``sim <command>: error: <message>``, exit status 2, no traceback (``--debug``
shows it). Those errors are a bad flag value (argparse, through :class:`Parser`) and the
library's ``ValueError``/``TypeError``, which name the field, the value and, for files, the file
and row; the commands turn a missing or unwritable user-named file into a ``ValueError`` before
they start. An ``OSError`` while writing (a full disk, a folder made read-only) is one line
too, exit status 1: every output is written whole or not at all (:mod:`sim.results.atomic`,
:func:`sim.cli.output.write_outputs`), so the previous files stay. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import warnings
from functools import partial

from . import capacity, catalog, compare, device, fit, info, plan, run, serve, sweep

USER_ERRORS = (ValueError, TypeError)


class Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line (``sim run: error: ...``) and exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def parse_checked(self, argv, check):
        """``parse_args(argv)``, then ``check(args)``, whose ``ValueError`` (a value no ``type``
        can judge alone: an unknown preset, an output path, a missing GPU) ends the same way:
        for a command without sub-commands (``experiments/gemm_check.py``)."""
        args = self.parse_args(argv)
        try:
            check(args)
        except ValueError as e:
            self.error(one_line(e))
        return args


def one_line(message) -> str:
    return " ".join(str(message).split())


def os_error(e: OSError) -> str:
    """An ``OSError`` in one line: what failed, on which file; a full disk says that the
    outputs are written whole or not at all (sim.results.atomic), so the previous ones stay."""
    what = e.strerror or str(e) or type(e).__name__
    where = f": {e.filename}" if e.filename else ""
    if e.errno == errno.ENOSPC:
        return (f"{what}{where} (the disk is full: nothing was half-written, the files already "
                f"in the output folder are as they were; free space and run again)")
    return one_line(f"{what}{where}")


def _one_line_warning(command, seen, message, category, filename, lineno, file=None,
                      line=None):
    text = one_line(message)
    if text not in seen:  # once per command: a search's many runs repeat their warnings
        seen.add(text)
        print(f"sim {command}: warning: {text}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="sim", description="LLM-serving simulator")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (default: one line)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run.add_parser(sub)
    capacity.add_parser(sub)
    sweep.add_parser(sub)
    plan.add_parser(sub)
    compare.add_parser(sub)
    fit.add_parser(sub)
    serve.add_parser(sub)
    info.add_parsers(sub)
    catalog.add_parsers(sub)
    device.add_parsers(sub)
    for p in sub.choices.values():  # ``sim run ... --debug`` as well as ``sim --debug run ...``
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the traceback of an error (default: one line)")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the command they were given to: 'sim compare --help', not 'sim --help'
        sub = parser._subparsers._group_actions[0].choices.get(args.command, parser)
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help()
        return 2
    try:
        with warnings.catch_warnings():  # a library warning as one line in the CLI's voice
            warnings.showwarning = partial(_one_line_warning, args.command, set())
            return args.func(args)
    except USER_ERRORS as e:
        if args.debug:
            raise
        print(f"sim {args.command}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback (the shell's status for SIGINT)
        if args.debug:
            raise
        print(f"sim {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # ``sim run | head``: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (Python's recipe)
        return 1
    except OSError as e:  # a full disk, a folder not writable: one line naming the file
        if args.debug:
            raise
        print(f"sim {args.command}: error: {os_error(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
