"""Heterogeneous disaggregated pools (prefill on one GPU type, decode on another): the mixed
fleet's dollars and watts by hand, the network link between two GPU types, the CLI keys, and a
plan over a space with heterogeneous splits whose winner replays with sim run."""

import json

import pandas as pd
import pytest

import sim
import workloads as wl
from sim.cli.main import main
from sim.specs.economics import gpu_power
from sim.specs.links import NIC_GBPS, network_link_gbps
from sim.specs.memory import kv_cache_bytes

MIXED = sim.Disaggregation(prefill_replicas=2, decode_replicas=1, prefill={"gpu": "h100"},
                           decode={"gpu": "l40s", "tensor_parallel": 2})


@pytest.fixture(scope="module")
def df():
    return wl.load("sharegpt", n=60, rate=4.0, seed=3)


def test_the_mixed_fleets_dollars_and_watts_by_hand(df):
    res = sim.run(df, sim.SimConfig(model="llama-3.1-8b", gpu="a100", disaggregation=MIXED))
    s = res.summary()
    # 2 prefill replicas x 1 H100 at $2.99 (RunPod) + 1 decode replica x 2 L40S at $0.8994
    # (Cudo): sim/data/gpu_prices.csv's default rows; the run's own GPU (A100) is in no pool
    assert s["usd_per_hour"] == pytest.approx(2 * 1 * 2.99 + 1 * 2 * 0.8994, rel=1e-12)
    assert s["num_gpus"] == 4
    it = res.iterations
    watts = 0.0
    for gpu, reps, tp in (("h100", [0, 1], 1), ("l40s", [2], 2)):
        busy = it.loc[it["replica"].isin(reps), "duration"].sum() / s["duration"] / len(reps)
        t = gpu_power(gpu)
        watts += len(reps) * tp * (t.idle_watts + t.active_fraction * (t.max_watts
                                                                       - t.idle_watts) * busy)
    assert s["avg_power_watts"] == pytest.approx(watts, rel=1e-9)
    assert s["usd_per_million_output_tokens"] == pytest.approx(
        s["usd_per_hour"] / (s["output_token_throughput"] * 3600) * 1e6, rel=1e-12)


def test_between_two_gpu_types_the_kv_crosses_the_network():
    assert network_link_gbps("h100", "h200") == NIC_GBPS == 50.0  # PCIe Gen5: 64 GB/s each way
    assert network_link_gbps("h100", "l40s") == 32.0  # the L40S's PCIe Gen4 x16: 64 / 2
    one = pd.DataFrame({"arrival_time": [0.0], "num_prompt_tokens": [2048],
                        "num_output_tokens": [4]})
    for dis, gbps in ((sim.Disaggregation(decode={"gpu": "l40s"}), 32.0),
                      (sim.Disaggregation(), 450.0)):  # (same GPU: its NVLink, as before)
        res = sim.run(one, sim.SimConfig(model="llama-3.1-8b", gpu="h100", disaggregation=dis))
        nbytes = kv_cache_bytes(2048, model="llama-3.1-8b")
        assert res.requests["kv_transfer_time"].iloc[0] == pytest.approx(nbytes / (gbps * 1e9),
                                                                         rel=1e-9)


def test_the_cli_keys_are_the_pools_overrides(tmp_path):
    toml = tmp_path / "mixed.toml"
    toml.write_text('model = "llama-3.1-8b"\ngpu = "a100"\nworkload = "sharegpt"\n'
                    'num_requests = 60\nrate = 4.0\nseed = 3\nprefill_replicas = 2\n'
                    'decode_replicas = 1\nprefill_gpu = "h100"\ndecode_gpu = "l40s"\n'
                    'decode_tensor_parallel = 2\n'
                    f'output = "{tmp_path / "out"}"\n')
    assert main(["run", str(toml), "-q"]) == 0
    got = json.loads((tmp_path / "out" / "summary.json").read_text())["summary"]
    want = sim.run(wl.load("sharegpt", n=60, rate=4.0, seed=3),
                   sim.SimConfig(model="llama-3.1-8b", gpu="a100", disaggregation=MIXED)).summary()
    for key in ("usd_per_hour", "ttft_p99", "avg_power_watts", "e2e_mean"):
        assert got[key] == pytest.approx(want[key], rel=1e-12)


@pytest.mark.parametrize("argv, message", [
    (["--decode-gpu", "l40s"], "--decode-gpu applies to disaggregation only: give --prefill-replicas"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--decode-gpu", "l4s"],
     "--decode-gpu 'l4s' is not a GPU preset"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--decode-tp", "0"], "--decode-tp"),
])
def test_bad_pool_settings_are_one_line_errors(argv, message, capsys, tmp_path):
    try:
        code = main(["run", "-n", "5", "--rate", "1", "-o", str(tmp_path), *argv])
    except SystemExit as e:  # (argparse's own checks)
        code = e.code
    assert code != 0
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


PLAN = """model = "llama-3.1-8b"
workload = "sharegpt"
num_requests = 120
rate = 3.0

[slo]
ttft = 1.0
tpot = 0.05

[space]
split = ["1:1", "2:1"]
prefill_gpu = ["h100", "l40s"]
decode_gpu = ["h100", "l40s"]
"""


def test_a_plan_over_heterogeneous_pools_replays_with_sim_run(tmp_path, plan_and_replay):
    (tmp_path / "plan.toml").write_text(PLAN)
    plan_and_replay(tmp_path)
    table = pd.read_csv(tmp_path / "out" / "plan.csv")
    # L40S to L40S has no NVLink and no link given: invalid; the rest simulated
    invalid = table[table["stage"] == "invalid"]
    assert ((invalid["prefill_gpu"] == "l40s") & (invalid["decode_gpu"] == "l40s")).all()
    ranked = table[table["status"] == "ranked"]
    best = ranked.iloc[0]
    assert best["prefill_gpu"] != best["decode_gpu"]  # a mixed fleet is the cheapest
    assert (ranked["usd_per_million_output_tokens"] >= best["usd_per_million_output_tokens"]).all()
    winner = (tmp_path / "out" / "winner.toml").read_text()
    assert f'prefill_gpu = "{best["prefill_gpu"]}"' in winner
    summary = json.loads((tmp_path / "out" / "winner" / "summary.json").read_text())["summary"]
    assert summary["slo_attainment"] >= 0.9
    for key in ("usd_per_million_output_tokens", "usd_per_hour", "ttft_p99"):
        assert summary[key] == pytest.approx(best[key], rel=1e-12)
