"""The Gantt chart: one bar per request, its phases on simulated seconds.

:func:`plot_gantt` draws the first ``max_requests`` requests by arrival, first on top: waiting
(arrival -> first scheduled), prefill (-> first token) and decode (-> finish), and where the run
has them the request path in and out and the KV transfer of a disaggregated run
(:func:`gantt_phases`). Rejected requests have no bars (the title counts them).

Invariant: the phases of a request tile its time from arrival to finish, in order, with no gap
and no overlap (the engine's times are the client's less the path's ``out_s``).
"""

from __future__ import annotations

import numpy as np

from .figure import finish, need_columns, pyplot, run_title


# the columns every Gantt reads (a request path and disaggregation add their own)
GANTT_COLUMNS = ("arrival_time", "first_scheduled_time", "first_token_time", "finish_time")


def gantt_phases(result, fin) -> list:
    """``(label, start, end, color)`` per phase of the finished requests ``fin``: waiting,
    prefill and decode, with a request path (``engine_arrival_time``) its time in (arrival to
    the engine) and out (``out_s`` on the last token) as phases of their own, and with
    disaggregation (``kv_transfer_time``) the KV transfer between prefill and decode (the
    first token streams when it has landed)."""
    path = getattr(result.config, "request_path", None)
    out = float(path.out_s) if path is not None else 0.0
    first = fin["first_token_time"] - out  # the engine's times (the client's less out_s)
    end = fin["finish_time"] - out
    phases = []
    queued = fin["arrival_time"]
    if "engine_arrival_time" in fin:
        queued = fin["engine_arrival_time"]
        phases.append(("request path", fin["arrival_time"], queued, "tab:purple"))
    transfer = fin["kv_transfer_time"].fillna(0.0) if "kv_transfer_time" in fin else None
    prefilled = first if transfer is None else first - transfer  # (NaN: 1 token, no transfer)
    phases += [("waiting", queued, fin["first_scheduled_time"], "tab:gray"),
               ("prefill", fin["first_scheduled_time"], prefilled, "tab:orange")]
    if transfer is not None:
        phases.append(("KV transfer", prefilled, first, "tab:green"))
    phases.append(("decode", first, end, "tab:blue"))
    if path is not None:
        phases.append(("response path", end, fin["finish_time"], "tab:pink"))
    return phases


def plot_gantt(result, path=None, max_requests=100):
    """One row per request (the first ``max_requests`` by arrival), bars for waiting, prefill
    and decode in simulated seconds (and, where the run has them, the request path in and
    out and the KV transfer: :func:`gantt_phases`); saved to ``path`` and closed when
    given."""
    if isinstance(max_requests, bool) or not isinstance(max_requests, int) or max_requests < 1:
        raise ValueError(f"max_requests must be a positive integer, got {max_requests!r}")
    req = result.requests
    need_columns(req, ["status", *GANTT_COLUMNS], "plot_gantt")
    shown = req.sort_values("arrival_time", kind="stable").iloc[:max_requests]
    fin = shown[shown["status"] == "finished"]
    if not len(fin):
        raise ValueError(f"plot_gantt: no finished request among the first {len(shown)}")
    plt = pyplot(path is not None)
    fig, ax = plt.subplots(figsize=(12, min(10.0, max(3.0, 0.12 * len(shown) + 1.5))))
    y = np.arange(len(shown))[(shown["status"] == "finished").to_numpy()]
    for label, start, end, color in gantt_phases(result, fin):
        ax.barh(y, end - start, left=start, height=0.8, color=color, label=label)
    ax.invert_yaxis()  # first arrival on top
    ax.set(xlabel="simulated time (s)", ylabel="request (by arrival)")
    rejected = len(shown) - len(fin)
    more = f" (first {len(shown):,} of {len(req):,})" if len(req) > len(shown) else ""
    ax.set_title(f"requests{more}" + (f"; {rejected} rejected (no bar)" if rejected else ""))
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)  # (off the bars)
    fig.suptitle(run_title(result))
    fig.tight_layout()
    return finish(fig, path, plt)

