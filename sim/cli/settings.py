"""A command's settings: the table's defaults, then a TOML file, then the flags, checked.

:func:`settings_from` gives the settings record: one value per top-level TOML key of the table
(:mod:`sim.cli.table`; ``slo`` and ``speculative`` hold their tables' keys), every row's check
applied to flag and file values alike, then the checks across settings (:func:`check_settings`),
plus ``extra``: the command's own keys the file gave (``report``, ``grid``, ...). It is what
``summary.json`` records and what :func:`sim.cli.build.config_from` turns into the config. A
file's unknown key is an error naming the file and the key, with a did-you-mean. Every message
names the setting as the user wrote it: ``--rate`` or ``exp.toml: rate`` (:class:`Names`).
:func:`add_flags` makes the table's flags for a command's parser.
"""

from __future__ import annotations

import argparse
import copy
import tomllib
from pathlib import Path

from ..checks import did_you_mean
from .arguments import not_beside_file
from .table import (BY_KEY, DEFAULTS, SETTINGS, TABLES, choices_of, flag_of, help_text,
                    key_of_flag, reference_rows, rows_for, table_keys, toml_keys)
from .table_hetero import ROWS as POOL_ROWS

POOL_KEYS = tuple(row.key for row in POOL_ROWS)  # (a pool of a disaggregated run: its own)

__all__ = ["DEFAULTS", "Names", "add_flags", "check_router_used", "check_settings",
           "is_default_scenario", "read_toml", "reference_rows", "settings_from"]

DEFAULT_SCENARIO = ("Llama-3.1-8B (fp16) on one H100-80GB, roofline cost model; the Azure LLM "
                    "inference 2023 'conv' trace (19,366 requests over ~58 min, replayed); "
                    "chunked prefill (512-token budget), max batch 256, KV pool from the memory "
                    "budget")
NOT_SCENARIO = ("output", "plots", "slo")  # settings that do not change what is simulated


def add_flags(p, rows, hide=()) -> None:
    """``rows``' flags on the parser ``p``, each stored under its row's ``dest``; a switch's
    second flag switches it off; the keys in ``hide`` are parsed but not listed in ``--help``."""
    for row in rows:
        if not row.flags:
            continue
        shown = argparse.SUPPRESS if row.key in hide else help_text(row)
        if row.parse is bool:
            p.add_argument(row.flags[0], *(f for f in row.flags[1:] if not f.startswith("--")),
                           action="store_true", default=None, dest=row.dest, help=shown)
            for off in (f for f in row.flags[1:] if f.startswith("--")):
                p.add_argument(off, action="store_false", default=None, dest=row.dest,
                               help=argparse.SUPPRESS if row.key in hide else row.off_help)
            continue
        p.add_argument(*row.flags, type=row.parse, choices=choices_of(row) or None,
                       metavar=row.metavar, dest=row.dest, help=shown)


def add_run_args(p, command="run", hide=()) -> None:
    """The optional TOML file and the flags of ``command`` (``run``, ``capacity``)."""
    p.add_argument("config", nargs="?",
                   help="TOML file with the same settings as the flags; flags override it")
    add_flags(p, rows_for(command), hide)


class Names:
    """How the user wrote each setting, for messages: ``--rate`` or ``exp.toml: rate``.
    ``from_file``: keys the TOML file set (``slo.ttft``, ``speculative.method`` for its tables'
    keys); ``from_flags``: keys a flag set (a flag overrides the file)."""

    def __init__(self, config):
        self.config, self.from_file, self.from_flags = config, set(), set()

    def like(self, key, other, metavar="") -> str:
        """``other`` (with its ``metavar`` value) in ``key``'s voice, for a message that starts
        with ``names(key)``: the file's bare key (``prefill_replicas``, ``closed_loop_users =
        USERS``) when ``key`` came from the file and no flag set ``other``, else
        ``names(other)`` (``--closed-loop USERS``)."""
        if key in self.from_file and other not in self.from_flags:
            return f"{other} = {metavar}" if metavar else other
        return f"{self(other)} {metavar}".rstrip()

    def table(self, name) -> str:
        """Whether the TOML file set any key of the ``[name]`` table."""
        return any(k.startswith(f"{name}.") for k in self.from_file)

    def __call__(self, key):
        return f"{self.config}: {key}" if key in self.from_file else flag_of(key)


def read_toml(config, command="run") -> dict:
    """The TOML file ``config`` as a dict; a key ``command`` does not take is an error naming
    the file and the key, with the closest known key."""
    path = Path(config)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise ValueError(f"config file {config!r} {what}")
    try:
        with open(path, "rb") as f:
            loaded = tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{config}: not a valid TOML file: {e}") from None
    except OSError as e:
        raise ValueError(f"{config}: cannot be read: {e.strerror or e}") from None
    known = toml_keys(command)
    unknown = sorted(set(loaded) - set(known))
    if unknown:
        meant = key_of_flag(unknown[0], known)  # a flag's name where its key belongs
        hint = (f" ({unknown[0]!r} is the {flag_of(meant)} flag; its key is {meant!r})" if meant
                else did_you_mean(unknown[0], known))
        raise ValueError(f"{config}: unknown setting(s) {unknown}{hint}; known: {sorted(known)}")
    return loaded


def settings_from(args, names=None, command=None) -> dict:
    """The settings of ``command`` (default ``args.command``): the table's defaults, then the
    TOML file ``args.config`` (unknown keys are an error), then every flag given; ``--slo-*``
    and the speculative flags merge into their tables. Checked by :func:`check_settings`;
    ``names`` (a :class:`Names`, filled in here) says how the user wrote each one. The file's
    keys of the command's own settings are returned in ``s["extra"]``."""
    command = command or getattr(args, "command", None) or "run"
    s = copy.deepcopy(DEFAULTS)
    names = names if names is not None else Names(args.config)
    given, extra = set(), {}
    if args.config:
        loaded = read_toml(args.config, command)
        extra = {k: loaded.pop(k) for k in list(loaded) if k not in s}
        s.update(loaded)
        given |= set(loaded)
        names.from_file = set(loaded) | {f"{table}.{k}" for table in TABLES
                                         for k in (loaded.get(table)
                                                   if isinstance(loaded.get(table), dict)
                                                   else ())}
    for key in s:
        v = getattr(args, BY_KEY[key].dest, None) if key in BY_KEY else None
        if v is not None:
            s[key] = v
            given.add(key)
            names.from_file.discard(key)
            names.from_flags.add(key)
    for table, what in (("slo", "a table of limits in seconds ([slo] with ttft, itl, tpot, "
                                "e2e)"),
                        ("speculative", f"a table ([speculative] with "
                                        f"{', '.join(table_keys('speculative'))})")):
        if not isinstance(s[table], dict):
            raise TypeError(f"{names(table)} must be {what}, got {s[table]!r}")
        s[table] = dict(s[table])
        for key in table_keys(table):
            v = getattr(args, BY_KEY[f"{table}.{key}"].dest, None)
            if v is not None:
                s[table][key] = v
                names.from_file.discard(f"{table}.{key}")
                names.from_flags.add(f"{table}.{key}")
    checked = check_settings(s, names, given)
    checked["extra"] = extra
    return checked


def given_value(args, s, key):
    """``(value, shown)`` of a command's own setting ``key`` (``report``, ``request_path``,
    ``repeats``): its flag's, else the file's (``s["extra"]``), checked by its row; ``(None,
    None)`` when neither gives it."""
    row = BY_KEY[key]
    if getattr(args, row.dest, None) is not None:
        value, shown = getattr(args, row.dest), row.flags[0]
    elif key in s["extra"]:
        value, shown = s["extra"][key], f"{args.config}: {key}"
    else:
        return None, None
    return (row.check(shown, value) if row.check else value), shown


def flag_values(args, keys) -> dict:
    """The values of the flags of ``keys`` on a command that reads no TOML file (``sim workload
    describe``, ``sim memory``), by their rows' API fields: each given one checked by its row,
    the others their rows' defaults."""
    out = {}
    for key in keys:
        row = BY_KEY[key]
        value = getattr(args, row.dest, None)
        out[row.api_field] = row.default if value is None else (
            row.check(row.flags[0], value) if row.check else value)
    return out


def _check_rows(s, names) -> None:
    """Every row's own check, in the table's order (the engine's knobs: SimConfig's)."""
    for table in TABLES:
        known = table_keys(table)
        unknown = sorted(set(s[table]) - set(known))
        if unknown and table == "slo":
            raise ValueError(f"{names('slo')}: unknown SLO(s) {unknown}; known: {known}")
        if unknown:
            raise ValueError(f"{names(table)}: unknown key(s) {unknown}"
                             f"{did_you_mean(unknown[0], known)}; known: {known}")
    for row in SETTINGS:
        top, _, sub = row.key.partition(".")
        if row.check is None or top not in s:
            continue
        where, key = (s[top], sub) if sub else (s, top)
        if where.get(key) is not None:
            where[key] = row.check(names(row.key), where[key])


def check_settings(s, names=None, given=()) -> dict:
    """``s`` with every row's check applied, then the checks across settings: a link without
    pools, pools beside replicas, a rate beside a closed loop, a think time without one, a
    speculative table without its K, a profile beside a cost. ``names(key)`` says how the user
    wrote a key; ``given``: keys the user set."""
    names = names or Names(None)
    _check_rows(s, names)
    from workloads import trace_names
    for key in ("workload", "profile"):  # read from the working directory, not the file's folder
        if key in names.from_file and s[key] is not None and str(s[key]) not in trace_names():
            not_beside_file(s[key], key, names.config)
    pools = [k for k in ("prefill_replicas", "decode_replicas") if s[k] is not None]
    link = [k for k in ("link_bandwidth_gbps", "link_latency_s") + POOL_KEYS if k in given]
    if link and not pools:
        raise ValueError(f"{names(link[0])} applies to disaggregation only: give "
                         f"{names.like(link[0], 'prefill_replicas')} and/or "
                         f"{names.like(link[0], 'decode_replicas')}")
    if pools and s["replicas"] != 1:
        raise ValueError(f"{names('replicas')} and {names.like('replicas', pools[0])} exclude "
                         f"each other: a disaggregated run's size is its two pools")
    if "rate" in given and s["closed_loop_users"] is not None:
        raise ValueError(f"{names('rate')} applies to an open loop: with "
                         f"{names.like('rate', 'closed_loop_users')} the users issue the "
                         f"requests (drop the rate, or use "
                         f"{names.like('rate', 'think_time')})")
    if "think_time" in given and s["closed_loop_users"] is None:
        raise ValueError(f"{names('think_time')} applies to a closed loop only: give "
                         f"{names.like('think_time', 'closed_loop_users', 'USERS')} as well")
    if "speculative" in given and not s["speculative"]:
        raise ValueError(f"{names.config}: [speculative] is empty: give num_speculative_tokens "
                         f"and the draft's cost (draft_model, draft_cost_ratio, or method = "
                         f"\"ngram\"), or remove the table to run without speculation")
    if s["speculative"] and "num_speculative_tokens" not in s["speculative"]:
        if names.table("speculative"):
            raise ValueError(f"{names.config}: [speculative] needs num_speculative_tokens (K, "
                             f"the draft tokens per iteration)")
        raise ValueError(f"speculative decoding needs its number of draft tokens: give "
                         f"{names('speculative.num_speculative_tokens')} K")
    if s["profile"] is not None and "cost" in given:  # the profile would win, silently
        raise ValueError(f"{names('cost')} and {names.like('cost', 'profile')} exclude each "
                         f"other: a calibration profile prices every step")
    if s["profile"] is not None and not Path(s["profile"]).is_file():
        raise ValueError(f"{names('profile')} {str(s['profile'])!r}: no such file")
    return s


def check_router_used(s, names) -> None:
    """A router the user set (flag or file) for one colocated replica routes nothing: an error,
    as ``think_time`` without a closed loop is, never silently ignored. (``sim sweep`` does not
    call this: its grid may vary ``replicas`` under the file's router.)"""
    if s["replicas"] == 1 and s["prefill_replicas"] is None and s["decode_replicas"] is None \
            and ("router" in names.from_file or "router" in names.from_flags):
        raise ValueError(f"{names('router')} {s['router']!r} applies to several replicas only: "
                         f"give {names.like('router', 'replicas', 'N')} (N >= 2) or prefill and "
                         f"decode pools, or drop it")


def is_default_scenario(s) -> bool:
    """Whether the settings simulate exactly the README's default scenario."""
    return all(s[k] == v for k, v in DEFAULTS.items() if k not in NOT_SCENARIO)
