"""LoRA adapters (sim.engine.kv.lora, sim.costs.lora, workloads.lora): slot memory by hand,
admission that waits for a slot, loads from CPU or disk, the per-adapter GEMM term against
Punica's published bound, nothing lost, one-line errors."""

import csv
from pathlib import Path

import pandas as pd
import pytest

import sim
import workloads
from sim import ConstantCost, LoRAConfig
from sim.engine.kv.lora import AdapterSlots, adapter_bytes, slot_bytes
from sim.specs.models import get_model

MODEL = "llama-3.1-8b"
ANCHORS = Path(sim.__file__).parent / "data" / "lora_anchors.csv"


def _frame(ids, prompt=64, output=8):
    return pd.DataFrame({"arrival_time": [0.0] * len(ids),
                         "num_prompt_tokens": [prompt] * len(ids),
                         "num_output_tokens": [output] * len(ids), "lora_id": ids})


def test_slot_bytes_by_hand():
    # llama-3.1-8b: hidden 4096, 32 heads x 128, 8 KV heads, MLP 14336, 32 layers; per layer
    # q (4096+4096) + k, v (4096+1024 each) + o (4096+4096) + gate, up (4096+14336 each)
    # + down (14336+4096) = 81920 values per unit of rank
    per_rank = 32 * (8192 + 5120 + 5120 + 8192 + 3 * 18432)
    assert per_rank == 32 * 81920
    lora = LoRAConfig(max_loras=4, max_lora_rank=16)
    m = get_model(MODEL)
    assert slot_bytes(lora, m, 2) == 4 * 16 * per_rank * 2 == 335_544_320
    assert slot_bytes(lora, m, 2, tensor_parallel=2) == 335_544_320 / 2
    attn = LoRAConfig(max_lora_rank=8, target_modules=("q_proj", "v_proj"))
    assert slot_bytes(attn, m, 2) == 8 * 32 * (8192 + 5120) * 2


def test_slots_come_off_the_kv_budget():
    base = sim.SimConfig(model=MODEL, gpu="h100", scheduler="vllm")
    lora = LoRAConfig(max_loras=8, max_lora_rank=64)
    without, with_ = base.resolved_kv_blocks(), sim.SimConfig(
        model=MODEL, gpu="h100", scheduler="vllm", lora=lora).resolved_kv_blocks()
    block = sim.kv_cache_bytes(16, model=MODEL)  # vLLM's block of 16 tokens
    lost = slot_bytes(lora, get_model(MODEL), 2) / block
    assert without - with_ in (int(lost), int(lost) + 1)


def test_one_slot_two_alternating_adapters_serialise():
    """max_loras=1, A B A B at t=0: each request runs alone (continuous batching waits at the
    head for the slot), so the run is 4 x (O iterations of c + the one adapter's GEMM term)
    plus the loads: A and B from disk (then CPU -> GPU), then each again from the CPU cache."""
    c, out = 0.01, 8
    lora = LoRAConfig(max_loras=1, max_cpu_loras=2, max_lora_rank=16)
    res = sim.run(_frame(["A", "B", "A", "B"], output=out), scheduler="continuous",
                  cost_model=ConstantCost(c), model=MODEL, gpu="h100", lora=lora, check=True)
    gpu = sim.get_gpu("h100")
    size = adapter_bytes(get_model(MODEL), 16, 2)
    gemm = size / (gpu.memory_bandwidth_gbps * 1e9)  # (bytes-bound at 64 prompt tokens)
    loads = 2 * (size / 2e9 + size / 25e9) + 2 * size / 25e9
    expect = 4 * out * (c + gemm) + loads
    req = res.requests
    assert req["finish_time"].max() == pytest.approx(expect, rel=1e-9)
    assert list(req.sort_values("finish_time")["request_id"]) == [0, 1, 2, 3]
    s = res.summary()
    assert (s["lora_adapter_loads"], s["lora_disk_loads"]) == (4, 2)
    assert s["lora_distinct_per_batch_max"] == 1
    assert s["lora_load_time_per_request"] == pytest.approx(loads / 4)


def test_enough_slots_batch_the_adapters_together():
    lora = LoRAConfig(max_loras=2, max_lora_rank=16)
    res = sim.run(_frame(["A", "B", "A", "B"]), scheduler="continuous",
                  cost_model=ConstantCost(0.01), model=MODEL, gpu="h100", lora=lora)
    s = res.summary()
    assert s["lora_adapter_loads"] == 2 and s["lora_distinct_per_batch_max"] == 2
    assert res.requests["finish_time"].max() < 8 * 0.011 + 0.1


def test_gemm_term_under_punicas_published_bound():
    """Punica: LoRA adds at most ~2 ms per token; a decode step of 32 requests on 32 distinct
    rank-16 adapters (llama-3.1-8b, A100) costs under it, and more than 1 adapter's term."""
    row = next(r for r in csv.DictReader(ANCHORS.open()) if r["anchor"] ==
               "punica_added_latency")
    bound = float(row["value"]) / 1e3
    gpu = sim.get_gpu("a100")
    slots = AdapterSlots(LoRAConfig(max_loras=32, max_lora_rank=16), get_model(MODEL), 2, 1,
                         gpu.memory_bandwidth_gbps, gpu.fp16_tflops)
    from sim.costs.lora import LoRACost
    cost = LoRACost(ConstantCost(1e-3), slots, gpu.memory_bandwidth_gbps, gpu.fp16_tflops)
    slots.active = {f"a{k}": 1 for k in range(32)}
    many = cost.gemm_seconds(32)
    slots.active = {"a0": 32}
    one = cost.gemm_seconds(32)
    assert 0 < one < many < bound
    assert many == pytest.approx(32 * one)  # the per-adapter term: weights read per adapter


@pytest.mark.parametrize("replicas, caching", [(1, False), (2, False), (1, "block")])
def test_nothing_lost_zipf_mix(replicas, caching):
    df = workloads.synthetic(300, rate=40, prompt=256, output=32, seed=3)
    df = workloads.lora_mix(df, adapters=12, zipf=1.1, base_fraction=0.2, seed=4)
    lora = LoRAConfig(max_loras=3, max_cpu_loras=6, max_lora_rank=32)
    res = sim.run(df, scheduler="vllm", lora=lora, replicas=replicas, prefix_caching=caching,
                  check=True)
    s = res.summary()
    assert len(res.requests) == 300
    assert res.requests["finish_time"].notna().all()
    assert 0 < s["lora_distinct_per_batch_max"] <= 3
    assert s["lora_disk_loads"] >= 6  # more adapters than the CPU cache holds
    again = sim.run(df, scheduler="vllm", lora=lora, replicas=replicas,
                   prefix_caching=caching)
    assert again.requests["finish_time"].equals(res.requests["finish_time"])


def test_lora_mix_zipf_and_base_share():
    df = workloads.synthetic(4000, rate=10, prompt=8, output=8, seed=0)
    out = workloads.lora_mix(df, adapters=4, zipf=1.0, base_fraction=0.25, seed=1)
    assert "lora_id" not in df.columns
    counts = out["lora_id"].value_counts(dropna=False)
    assert abs(out["lora_id"].isna().mean() - 0.25) < 0.03
    w = workloads.zipf_weights(4, 1.0)
    assert w[0] / w[1] == pytest.approx(2.0)
    assert counts["lora-0"] > counts["lora-1"] > counts["lora-3"]
    assert out.equals(workloads.lora_mix(df, adapters=4, zipf=1.0, base_fraction=0.25, seed=1))


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_lora_rank=24), r"max_lora_rank must be one of \(8, 16"),
    (dict(max_loras=2, max_cpu_loras=1), r"max_cpu_loras \(1\) must be >= max_loras \(2\)"),
    (dict(max_lora_rank=16, ranks={"a": 32}), r"ranks\['a'\]=32 exceeds max_lora_rank=16"),
    (dict(max_loras=0), r"max_loras must be an integer >= 1, got 0"),
    (dict(cpu_gbps=0), r"cpu_gbps must be a number > 0"),
    (dict(target_modules=("lm_head",)), r"target_modules must be"),
])
def test_bad_settings_are_one_line_errors(kwargs, match):
    with pytest.raises(ValueError, match=match) as e:
        LoRAConfig(**kwargs)
    assert "\n" not in str(e.value)


def test_adapter_without_rank_and_lora_off_are_errors():
    lora = LoRAConfig(ranks={"A": 8})
    with pytest.raises(ValueError, match=r"lora_id 'B' has no rank"):
        sim.run(_frame(["A", "B"]), scheduler="continuous", lora=lora)
    with pytest.raises(ValueError, match=r"LoRA is off"):
        sim.run(_frame(["A", None]), scheduler="continuous")
    with pytest.raises(ValueError, match=r"lora with disaggregation"):
        sim.SimConfig(lora=LoRAConfig(), disaggregation=sim.Disaggregation(1, 1))


def test_base_only_column_is_the_base_model():
    df = _frame([None, None])
    plain = sim.run(df.drop(columns="lora_id"), scheduler="continuous")
    assert sim.run(df, scheduler="continuous").requests["finish_time"].equals(
        plain.requests["finish_time"])


def test_vllm_skips_a_request_whose_adapter_has_no_slot():
    """vLLM v1: A B A B with one slot: the second A is admitted beside the first (B is
    skipped, not waited for), so B's two requests run after both A's: 2 loads, not 4."""
    lora = LoRAConfig(max_loras=1, max_cpu_loras=2)
    res = sim.run(_frame(["A", "B", "A", "B"]), scheduler="vllm", cost_model=ConstantCost(0.01),
                  model=MODEL, gpu="h100", lora=lora, check=True)
    order = list(res.requests.sort_values(["finish_time", "request_id"])["request_id"])
    assert order == [0, 2, 1, 3]
    assert res.summary()["lora_adapter_loads"] == 2


def test_cli_ranks_are_the_engines():
    from sim.cli.table_lora import LORA_RANKS
    from sim.engine.kv.lora import VLLM_RANKS
    assert LORA_RANKS == VLLM_RANKS


def test_slora_table3_throughput_vs_adapters(load_script):
    """S-LoRA's Table 3 (sim/data/lora_anchors.csv, slora_table3_*) replayed by
    experiments/lora_adapters.py: throughput(N) / throughput(5) within 25 % at every N of
    both settings, the curve never rising, and the absolute req/s at N = 5 within 25 %."""
    exp = load_script("experiments/lora_adapters.py")
    t = exp.slora_curve()
    assert list(t.columns) == exp.COLUMNS and set(t["setting"]) == {"S1", "S2"}
    assert sorted(t["adapters"].unique()) == [5, 100, 1000, 2000]
    for _, g in t.groupby("setting"):
        assert g["simulated_ratio"].to_numpy() == pytest.approx(
            g["published_ratio"].to_numpy(), rel=0.25)  # S2 at 2000: 0.975 vs 0.899
        assert (g["simulated_ratio"].diff().dropna() <= 1e-12).all()
        first = g.iloc[0]
        assert first["simulated_req_s"] == pytest.approx(first["published_req_s"], rel=0.25)


def test_slora_workload_is_its_generator(load_script):
    """The replay's requests are S-LoRA's generate_requests draws: 1,200 of them, adapters
    uniform over N (alpha 1), lengths in [8, 512), Poisson at 10 req/s."""
    df = load_script("experiments/lora_adapters.py").slora_workload(100)
    assert df.equals(load_script("experiments/lora_adapters.py").slora_workload(100))
    assert len(df) == 1200 and df["lora_id"].between(0, 99).all()
    assert df["lora_id"].nunique() == 100
    for col in ("num_prompt_tokens", "num_output_tokens"):
        assert df[col].between(8, 511).all()
    assert 1200 / df["arrival_time"].iloc[-1] == pytest.approx(10, rel=0.1)


@pytest.mark.parametrize("adapters", [0, -3, 2.0, True, "4"])
def test_lora_mix_names_a_bad_adapter_count(adapters):
    """``adapters=0`` once reached numpy ("a must be a positive integer ..."), and -3 was
    called ``n``: the message names the argument and the value."""
    df = workloads.synthetic(5, rate=1.0, prompt=10, output=2, seed=0)
    with pytest.raises(ValueError, match=f"adapters must be an integer >= 1, got {adapters!r}"):
        workloads.lora_mix(df, adapters=adapters, seed=0)
