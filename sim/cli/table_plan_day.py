"""The ``[day]`` table of ``sim plan``: a plan over a day of traffic, fixed fleets against
autoscaled ones (a row of the CLI's one table, :mod:`sim.cli.table`, appended there as
``ROWS``; the command is :mod:`sim.cli.plan_day`).

Its keys: the day's shape (``hours``, ``peak_to_trough``, ``peak_hour``, ``period_hours``:
:func:`workloads.day_like`, the file's workload at its ``rate`` as the day's peak), ``fixed``
(fixed fleet sizes to rank beside the autoscaled candidates) and any
:class:`sim.Autoscaler` field (the policy every candidate starts from); the file's
``[space]`` then maps Autoscaler fields to lists of values. Checked in :mod:`sim.cli.plan_day`,
which knows the Autoscaler's fields; here only its shape. Loads nothing beyond the CLI's
argument helpers.
"""

from __future__ import annotations

from .setting import Setting


def _table(shown, value):
    if not isinstance(value, dict):
        raise ValueError(f"{shown} must be a table of the day's keys (hours, peak_to_trough, "
                         f"peak_hour, period_hours, fixed, Autoscaler fields), got {value!r}")
    return value


ROWS = (
    Setting("day", (), ("plan",), commands=("plan",), check=_table, kind="table: the day's keys",
            help="plan a day of traffic instead of one load: the workload at its rate is the "
                 "peak of a diurnal day (hours, peak_to_trough, peak_hour, period_hours), "
                 "fixed = [fleet sizes], Autoscaler fields as the policy; [space] then holds "
                 "Autoscaler fields (target, min_replicas, max_replicas, metric, ...)",
            default_help="default: no day, a plan at one load"),
)
