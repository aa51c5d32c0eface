"""``sim fit``'s own settings: rows of the settings table (:mod:`sim.cli.table`), appended to
it. Flags only (``sim fit`` reads no TOML file: the measured files are its input); the engine's
settings are ``sim run``'s rows (``sim compare``'s, less the cost model it fits).
"""

from __future__ import annotations

from .arguments import count, count_or_zero
from .setting import Setting

ROWS = (
    Setting("holdout", ("--holdout",), ("fit",), parse=int, metavar="N", check=count_or_zero,
            commands=("fit",), in_toml=False,
            help="measured runs held out of the fit and reported apart (evenly spaced in the "
                 "files' order; 0: none)",
            default_help="default: a quarter of them, at least one of two or more"),
    Setting("write", ("--write", "-o"), ("fit",), metavar="FILE.json", commands=("fit",),
            in_toml=False, default="sim-fit.json",
            help="the fit profile to write ('sim run --profile FILE.json' uses it)",
            default_help="default sim-fit.json", kind="file path ending in .json"),
    Setting("max_evaluations", ("--max-evaluations",), ("fit",), parse=int, metavar="N",
            check=count, commands=("fit",), in_toml=False, default=120,
            help="the search's budget: objective evaluations, each replaying every fit run",
            default_help="default 120; the search usually ends sooner, its steps below "
                         "tolerance"),
)
