"""One setting of the CLI's table (:mod:`sim.cli.table`): the row type, its targets, the commands
that share ``sim run``'s settings, and a policy's name in words for ``--help``.

A :class:`Setting` is frozen and holds no state: what a flag parses to, what a TOML value is
checked by and where either goes are its fields; the table is a tuple of them. Loads nothing
beyond the standard library (``sim --help`` builds its parser from the table).
"""

from __future__ import annotations

from dataclasses import dataclass

SHARED = ("run", "capacity", "sweep", "plan")  # the commands that read sim run's settings
# where a value goes, ``{field}`` its row's API field
TARGETS = {"workload": "workloads.load(..., {field}=)",
           "config": "SimConfig.{field}",
           "cost": "SimConfig.cost_model (from cost, or a profile)",
           "closed_loop": "SimConfig.closed_loop: workloads.ClosedLoop.{field}",
           "disaggregation": "SimConfig.disaggregation: sim.Disaggregation.{field}",
           "prefill_pool": "SimConfig.disaggregation: sim.Disaggregation.prefill['{field}']",
           "decode_pool": "SimConfig.disaggregation: sim.Disaggregation.decode['{field}']",
           "speculative": "SimConfig.speculative: sim.SpeculativeConfig.{field}",
           "kv_offload": "SimConfig.kv_offload: sim.KVTier.{field}",
           "kv_tiers": "SimConfig.kv_offload: sim.KVTierChain (sim.offload_preset) {field}",
           "request_path": "SimConfig.request_path: sim.RequestPath",
           "lora": "SimConfig.lora: sim.LoRAConfig.{field}",
           "lora_switch": "SimConfig.lora: a sim.LoRAConfig when on",
           "lora_mix": "workloads.lora_mix(df, {field}=)",
           "slo": "Result.summary(slo={{'{field}': seconds}})",
           "output": "the files and lines the command writes",
           "sweep": "sim sweep's {field}",
           "plan": "sim plan's {field}",
           "fit": "sim fit's {field}"}


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: see the module docstring. ``to``: its targets (:data:`TARGETS`); ``field``:
    its API field there when that is not the key's last part (``num_requests``: the loader's
    ``n``); ``parse``: the flag's argparse ``type`` (``bool``: a switch, ``store_true``; a
    second flag switches it off); ``check(shown, value)``: the value checked and normalised,
    ``shown`` the setting as the user wrote it (:mod:`sim.cli.arguments`); ``default_help``: the
    parenthesis ending its help; ``kind``: its type in words for the reference (else from
    ``parse`` and ``choices``). ``help`` and ``choices`` may be functions, read when a parser
    is built (:func:`help_of`, :func:`choices_of`)."""

    key: str
    flags: tuple = ()
    to: tuple = ("config",)
    field: str = ""
    help: str = ""
    default_help: str = ""
    default: object = None
    parse: object = None
    choices: tuple = ()
    metavar: str | None = None
    check: object = None
    commands: tuple = SHARED
    in_toml: bool = True
    kind: str = ""
    off_help: str = ""

    @property
    def dest(self) -> str:
        """The flag's attribute on argparse's namespace."""
        return self.key.replace(".", "_")

    @property
    def api_field(self) -> str:
        return self.field or self.key.rsplit(".", 1)[-1]


def first_line(cls) -> str:
    """A policy's name in words for ``--help``: its docstring up to the first ':' or '.' outside
    parentheses, without long parentheticals ("Chunked prefill (Sarathi-style)")."""
    text = " ".join((cls.__doc__ or cls.__name__).strip().split("\n\n")[0].split())
    out, depth, group = [], 0, []
    for ch in text.replace("``", ""):
        if depth == 0 and ch in ":.":
            break
        depth += (ch == "(") - (ch == ")")
        group.append(ch)
        if depth == 0:
            if len(group) <= 40 or group[0] != "(":
                out.extend(group)
            group = []
    return "".join(out).strip()
