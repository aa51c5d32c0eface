"""The planner's figure: cost against latency, one point per ranked candidate, the Pareto
frontier joined and the winner ringed (a table as :func:`sim.plan` returns).

matplotlib is imported lazily through :mod:`.plots.figure`. Pruned candidates are left out; a
table with no ranked candidate, or without the two columns, is a ``ValueError`` naming them.
"""

from __future__ import annotations

from .plots.figure import finish, need_columns, pyplot


def plot_pareto(table, objective="usd_per_million_output_tokens", latency="ttft_p99",
                path=None, *, label=None):
    """The cost-latency plot of a plan ``table``; ``label``: a column naming each point
    (default none)."""
    need_columns(table, [objective, latency, "status", "pareto"], "plot_pareto")
    ranked = table[table["status"] == "ranked"]
    if not len(ranked):
        raise ValueError("plot_pareto: no ranked candidate to draw (every one was pruned)")
    plt = pyplot(path is not None)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.scatter(ranked[latency], ranked[objective], s=18, color="#999", label="ranked")
    front = ranked[ranked["pareto"]].sort_values(latency)
    ax.plot(front[latency], front[objective], "-o", color="C0", ms=5, label="Pareto frontier")
    best = ranked.iloc[0]
    ax.scatter([best[latency]], [best[objective]], s=140, facecolors="none", edgecolors="C3",
               linewidths=2, label="winner")
    if label is not None and label in ranked:
        for _, row in front.iterrows():
            ax.annotate(str(row[label]), (row[latency], row[objective]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel(latency + (" (s)" if latency.split("_")[0] in ("ttft", "itl", "tpot", "e2e")
                             else ""))
    ax.set_ylabel(objective)
    ax.set_title(f"{len(ranked)} of {len(table)} candidates meet the SLO")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return finish(fig, path, plt)
