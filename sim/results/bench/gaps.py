"""Each finished request's token times, rebuilt from the iterations (a result stores ITL pooled,
not per request).

A running request emits a token at the end of every iteration of its replica from the one that
gave its first token to the one that finished it (the engine's invariant: every running decode
emits each iteration), so its gaps are the differences of those iteration end times. Where that
does not hold - a preempted request (its tokens pause while it waits), speculative decoding
(several tokens per iteration), disaggregation (first token and the rest on two replicas), a
request path (times shifted off the iteration ends) - the count of iterations found is not
``n - 1`` and the request's gaps are taken even: ``n - 1`` gaps of its TPOT. Either way a
request's gaps sum to E2E - TTFT.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-9  # s: an iteration end equal to a token time, within float rounding


def token_gaps(result) -> tuple[list, int]:
    """(one float64 array of gaps per request, in the requests' order - empty for an unfinished
    or one-token request -, how many requests had theirs taken even)."""
    req, it = result.requests, result.iterations
    ends = {}
    for replica, grp in it.groupby("replica", sort=False):
        ends[replica] = np.sort((grp["start"] + grp["duration"]).to_numpy())
    out, even = [], 0
    cols = zip(req["status"].to_numpy(), req["replica"].to_numpy(),
               req["first_token_time"].to_numpy(), req["finish_time"].to_numpy(),
               req["num_output_tokens"].to_numpy(), req["ttft"].to_numpy(),
               req["e2e"].to_numpy())
    for status, replica, first, finish, n, ttft, e2e in cols:
        if status != "finished" or n < 2:
            out.append(np.zeros(0))
            continue
        e = ends.get(replica, np.zeros(0))
        lo, hi = np.searchsorted(e, first - EPS), np.searchsorted(e, finish + EPS, side="right")
        g = np.diff(e[lo:hi])
        if len(g) != n - 1:
            g = np.full(n - 1, (e2e - ttft) / (n - 1))
            even += 1
        out.append(g)
    return out, even
