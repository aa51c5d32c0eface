"""Small traps of issue 32 found by the new-user review: a router over one replica from the
API, and rejections for a pool too small without a count of their own in the summary."""

import pytest

import sim
import workloads as wl
from sim.cli import main

COST = sim.ConstantCost(0.01)


def _df():
    return wl.synthetic(60, rate=5.0, prompt=wl.LogNormal(400, 1.0, max_tokens=3000),
                        output=50, seed=1)


def test_a_router_over_one_replica_is_a_warning_not_silently_ignored():
    with pytest.warns(UserWarning, match=r"router='least_outstanding' routes nothing: there "
                                         r"is one replica"):
        sim.run(_df(), cost_model=COST, router="least_outstanding")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sim.run(_df(), cost_model=COST)  # the default router: nothing said
        sim.run(_df(), cost_model=COST, router="least_outstanding", replicas=2)
        # a sweep over replicas keeps the base's router for its points of several
        sim.sweep(_df(), {"replicas": [1, 2]}, base=sim.SimConfig(
            cost_model=COST, router="least_outstanding"), workers=1)


@pytest.mark.parametrize("fleet", [{}, {"replicas": 2},
                                   {"disaggregation": sim.Disaggregation(1, 1)}])
def test_requests_larger_than_the_pool_have_their_own_count(fleet):
    res = sim.run(_df(), cost_model=COST, kv_blocks=40, **fleet)
    req = res.requests
    too_big = req["num_prompt_tokens"] + req["num_output_tokens"] > 40 * 16
    s = res.summary()
    assert s["num_rejected_kv_pool"] == int(too_big.sum()) == s["num_rejected"] > 0
    assert req.loc[too_big, "reason"].str.startswith("kv_pool: needs ").all()
    assert s["num_rejected_context_length"] == s["num_rejected_max_num_tokens"] == 0


def test_the_cli_summary_says_why_requests_were_rejected(capsys, tmp_path):
    assert main(["run", "-w", "sharegpt", "-n", "200", "--rate", "4", "--kv-blocks", "60",
                 "-o", str(tmp_path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("requests"))
    assert "needing more KV than the pool holds)" in line
