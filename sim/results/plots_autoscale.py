"""The autoscaled day's figure: load and replicas over time above, SLO attainment below (a
:class:`~sim.tools.autoscale.AutoscaledRun`).

matplotlib is imported lazily through :mod:`.plots.figure`. The replica counts are the run's
step functions (paid: loading, serving and draining replicas; serving: routed to); the rate and
the attainment are per window of ``window_s`` seconds by arrival
(:meth:`AutoscaledRun.over_time`).
"""

from __future__ import annotations

from .plots.figure import finish, pyplot


def plot_autoscaled(run, slo, path=None, *, window_s=900.0):
    """The two panels of ``run`` (see the module docstring); ``slo``: per-request limits."""
    over = run.over_time(slo, window_s)
    plt = pyplot(path is not None)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    hours = 3600.0
    t = run.timeline["time"] / hours
    top.step(t, run.timeline["paid"], where="post", label="replicas paid", color="C3")
    top.step(t, run.timeline["serving"], where="post", label="replicas serving", color="C0")
    top.set_ylabel("replicas")
    rate = top.twinx()
    rate.plot((over["start"] + window_s / 2) / hours, over["rate"], color="#888", lw=1,
              label="arrival rate")
    rate.set_ylabel("req/s")
    top.legend(loc="upper left", fontsize=8)
    bottom.plot((over["start"] + window_s / 2) / hours, over["slo_attainment"], "-o", ms=3)
    bottom.set_ylim(0, 1.02)
    bottom.set_ylabel("SLO attainment")
    bottom.set_xlabel("time (h)")
    limits = ", ".join(f"{k} <= {v:g} s" for k, v in slo.items())
    top.set_title(f"autoscaled: {run.policy.metric} target {run.policy.target:g} per replica; "
                  f"{limits}", fontsize=9)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return finish(fig, path, plt)
