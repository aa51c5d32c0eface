"""plan_day: the cheapest fixed or autoscaled fleet whose day meets the SLO; every candidate
says why it lost, the winner replays to its numbers, a brute force finds nothing cheaper."""

import math

import pytest

import sim
import workloads
from sim.tools.plan_day import plan_day

SLO = {"ttft": 1.0}
BASE = sim.SimConfig(model="llama-3.1-8b", gpu="a100")
POLICY = sim.Autoscaler(scale_down_delay_s=30.0, interval_s=10.0)


@pytest.fixture(scope="module")
def day():
    return workloads.diurnal(0.2, mean_rate=12.0, peak_to_trough=6.0, peak_hour=0.1,
                             period_hours=0.2, prompt=workloads.LogNormal(600, 0.8,
                                                                          max_tokens=4000),
                             output=workloads.LogNormal(200, 0.8, max_tokens=1000), seed=1)


@pytest.fixture(scope="module")
def table(day):
    return plan_day(day, SLO, base=BASE, policy=POLICY, attainment=0.95, workers=1,
                    space={"min_replicas": [1, 3], "max_replicas": [2, 4], "target": [8, 24]},
                    fixed=[1, 2, 3, 4])


def test_every_candidate_gets_a_verdict(table):
    assert len(table) == 8 + 4
    invalid = table[table["stage"] == "invalid"]  # min 3 above max 2
    assert len(invalid) == 2 and invalid["reason"].str.contains("below min_replicas").all()
    slo = table[table["stage"] == "slo"]
    assert len(slo) and (slo["slo_attainment"] < 0.95).all()
    ranked = table[table["status"] == "ranked"]
    assert (ranked["slo_attainment"] >= 0.95).all() and ranked["usd"].is_monotonic_increasing
    assert list(ranked["rank"]) == list(range(1, len(ranked) + 1))
    assert set(table["kind"]) == {"autoscaled", "fixed"}


def test_the_winner_replays_and_nothing_is_cheaper(day, table):
    best = table.iloc[0]
    policy = sim.Autoscaler(**{**{k: getattr(POLICY, k) for k in ("scale_down_delay_s",
                                                                  "interval_s")},
                               "min_replicas": int(best["min_replicas"]),
                               "max_replicas": int(best["max_replicas"]),
                               "target": float(best["target"])})
    s = sim.run_autoscaled(day, BASE, policy).summary(slo=SLO)
    assert s["usd"] == pytest.approx(best["usd"], rel=1e-12)
    assert s["slo_attainment"] >= 0.95
    # brute force: every fixed fleet size and every policy of the space, the cheapest meeting
    cheapest = math.inf
    for n in (1, 2, 3, 4):
        f = sim.run_autoscaled(day, BASE, sim.Autoscaler(min_replicas=n, max_replicas=n))
        fs = f.summary(slo=SLO)
        if fs["slo_attainment"] >= 0.95:
            cheapest = min(cheapest, fs["usd"])
    assert best["usd"] <= cheapest + 1e-12


def test_bad_input_is_a_one_line_error(day):
    with pytest.raises(ValueError, match="space key 'targt' is not an Autoscaler field"):
        plan_day(day, SLO, base=BASE, space={"targt": [1]})
    with pytest.raises(ValueError, match="needs candidates"):
        plan_day(day, SLO, base=BASE)
    with pytest.raises(ValueError, match="attainment must be a fraction"):
        plan_day(day, SLO, base=BASE, fixed=[1], attainment=1.5)
