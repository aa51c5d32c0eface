"""Each experiment script runs at a small size, and its headline claim holds."""

import pandas as pd
import pytest

from sim.specs.gpus import get_gpu


def test_compare_schedulers(tmp_path, load_script):
    compare_schedulers = load_script("experiments/compare_schedulers.py")
    table = compare_schedulers.main(["-n", "600", "--rate", "10", "-o", str(tmp_path)])
    assert table.loc["continuous", "ttft_p50"] < table.loc["static", "ttft_p50"]
    assert table.loc["chunked", "itl_p99"] < table.loc["continuous", "itl_p99"]
    assert (tmp_path / "schedulers_latency_cdfs.png").exists()


def test_capacity_sweep(load_script):
    capacity_sweep = load_script("experiments/capacity_sweep.py")
    table, best = capacity_sweep.main(["-n", "400", "--rates", "1,4,16", "--workers", "2"])
    assert table["ttft_p99"].is_monotonic_increasing
    assert table["slo_attainment"].iloc[0] > table["slo_attainment"].iloc[-1]
    assert best in (1.0, 4.0)


def test_sweep_is_deterministic_across_process_pool_and_in_process():
    import workloads
    from sim import sweep
    df = workloads.load("azure-code", n=200)
    jobs = [{"workload": df, "config": {"scheduler": s}, "label": {"s": s}}
            for s in ("continuous", "chunked")]
    a = sweep(jobs, workers=1).drop(columns="wall_seconds")
    b = sweep(jobs, workers=2).drop(columns="wall_seconds")
    assert a.equals(b)
    with pytest.raises(ValueError, match="jobs\\[0\\]"):
        sweep([{"config": {}}])


def test_sweep_on_a_dask_cluster_matches_local():
    from dask.distributed import Client, LocalCluster

    import workloads
    from sim import sweep
    df = workloads.load("azure-code", n=200)
    jobs = [{"workload": df, "config": {"scheduler": s}, "label": {"s": s}}
            for s in ("continuous", "chunked")]
    with LocalCluster(n_workers=2, processes=False, threads_per_worker=1,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        on_cluster = sweep(jobs, client=client).drop(columns="wall_seconds")
    assert on_cluster.equals(sweep(jobs, workers=1).drop(columns="wall_seconds"))


def test_compare_presets(tmp_path, load_script):
    compare_presets = load_script("experiments/compare_presets.py")
    table = compare_presets.main(["-n", "300", "-o", str(tmp_path)])
    # Mooncake turns repeat their prefix: vllm's block cache and sglang's radix tree hit
    assert (table.loc[["vllm", "sglang"], "prefix_hit_rate"] > 0.02).all()
    assert (table.drop(index=["vllm", "sglang"])["prefix_hit_rate"] == 0).all()
    assert table.loc["vllm", "ttft_p50"] < table.loc["vllm (no prefix cache)", "ttft_p50"]
    # chunked prefill (sarathi) keeps the P99 inter-token latency far below vllm's 8k budget
    assert table.loc["sarathi", "itl_p99"] < 0.5 * table.loc["vllm", "itl_p99"]
    # TensorRT-LLM's GUARANTEED_NO_EVICT reserves every request's KV: nothing is preempted
    assert table.loc["tensorrt-llm", "num_preemptions"] == 0
    assert (tmp_path / "presets.csv").exists() and (tmp_path / "presets_latency_cdfs.png").exists()


def test_speculative_breakeven(tmp_path, load_script):
    exp = load_script("experiments/speculative_breakeven.py")
    table, load = exp.main(["--tokens", "1500", "-n", "150", "-o", str(tmp_path)])
    # measured speedup tracks E / (k c + 1) and flips below 1 where the formula does
    assert ((table["speedup"] / table["formula"] - 1).abs() < 0.08).all()
    clear = table[(table["formula"] - 1).abs() > 0.05]
    assert (clear["pays"] == (clear["formula"] > 1)).all()
    assert not table["pays"].all() and table["pays"].any()
    assert load["speedup"].iloc[-1] < 0.8 * load["speedup"].iloc[0]
    assert (tmp_path / "speculative_breakeven.png").exists()


def test_precision_tradeoff(tmp_path, load_script):
    exp = load_script("experiments/precision_tradeoff.py")
    table = exp.main(["-n", "60", "--rate", "1", "-o", str(tmp_path)]).set_index(
        ["weight_dtype", "kv_dtype", "tensor_parallel"])
    assert not table.loc[("fp16", "fp16", 1), "fits"]  # 70B at fp16 on one 80 GB GPU
    assert "Quantize" in table.loc[("fp16", "fp16", 1), "advice"]
    fp8 = table.loc[("fp8", "fp16", 1), "kv_blocks"]
    assert table.loc[("fp8", "fp8", 1), "kv_blocks"] in (2 * fp8, 2 * fp8 + 1)
    assert table.loc[("int4", "fp16", 1), "kv_blocks"] > fp8
    assert (tmp_path / "precision.csv").exists() and (tmp_path / "precision.png").exists()
def test_routing(tmp_path, load_script):
    routing = load_script("experiments/routing.py")
    table = routing.main(["-n", "600", "--rate", "30", "-o", str(tmp_path)])
    assert list(table.index) == ["round_robin", "random", "least_outstanding", "least_kv",
                                 "prefix_affinity", "cache_aware"]
    assert table["prefix_hit_rate"].idxmax() in ("prefix_affinity", "cache_aware")
    for cache in ("prefix_affinity", "cache_aware"):  # both above every load-only router
        assert table.loc[cache, "prefix_hit_rate"] > table["prefix_hit_rate"].iloc[:4].max()
    assert table.loc["prefix_affinity", "ttft_p50"] < table.loc["round_robin", "ttft_p50"]
    assert table.loc["round_robin", "busiest_share"] == 0.25
    for name in ("routing.csv", "routing_latency_cdfs.png", "routing_replica_load.png"):
        assert (tmp_path / name).exists()


def test_disaggregation(tmp_path, load_script):
    disaggregation = load_script("experiments/disaggregation.py")
    table = disaggregation.main(["-n", "300", "--rates", "8,16", "-o", str(tmp_path)])
    assert sorted(set(table["layout"])) == ["1P:3D", "2P:2D", "3P:1D", "colocated"]
    assert (table["num_gpus"] == 4).all()
    at = table[table["rate"] == 16].set_index("layout")
    # decode pools never run prefills: TPOT stays at the decode step time
    assert at.loc["3P:1D", "tpot_p99"] < 0.2 * at.loc["colocated", "tpot_p99"]
    assert at.loc["1P:3D", "ttft_p50"] > at.loc["colocated", "ttft_p50"]  # one prefill GPU
    assert at["goodput_per_gpu"].idxmax() == "3P:1D"
    for name in ("disaggregation.csv", "goodput_per_gpu.png"):
        assert (tmp_path / name).exists()


def test_chunk_tradeoff(tmp_path, load_script):
    exp = load_script("experiments/chunk_tradeoff.py")
    table = exp.main(["-n", "600", "--chunks", "128,512,2048,8192", "--workers", "2",
                      "-o", str(tmp_path)]).set_index("chunk_size")
    assert (table["error"] == "").all()
    # a smaller chunk buys inter-token latency ...
    assert table["itl_p99"].is_monotonic_increasing
    assert table.loc[128, "itl_p99"] < 0.2 * table.loc[8192, "itl_p99"]
    # ... with time to first token: the whole prompt waits for more, smaller iterations
    assert table["ttft_p99"].is_monotonic_decreasing
    assert table.loc[128, "ttft_p99"] > 5 * table.loc[8192, "ttft_p99"]
    for name in ("chunk_tradeoff.csv", "chunk_tradeoff.png"):
        assert (tmp_path / name).exists()


def test_latency_vs_load(tmp_path, load_script):
    exp = load_script("experiments/latency_vs_load.py")
    table, knees = exp.main(["-n", "400", "--rates", "1,3,6,12", "--workers", "2",
                             "-o", str(tmp_path)])
    assert len(table) == 5 * 4 and (table["error"] == "").all()
    for _, part in table.groupby("scheduler"):  # past the knee the queue grows without bound
        assert part["ttft_p99"].is_monotonic_increasing
        assert part["ttft_p99"].iloc[-1] > max(3 * part["ttft_p99"].iloc[0], 2.0)
    # static batching saturates first; continuous batching has the highest throughput
    assert knees["max_throughput"].idxmin() == "static"
    assert knees.loc["continuous", "max_throughput"] > knees.loc["chunked", "max_throughput"]
    assert knees.loc["continuous", "ttft_knee"] >= knees.loc["chunked", "ttft_knee"]
    # chunked prefill keeps P99 ITL within the 0.1 s SLO at every rate, continuous does not
    assert knees.loc["chunked", "itl_knee"] == 12
    assert knees.loc["continuous", "itl_knee"] < knees.loc["chunked", "itl_knee"]
    for name in ("latency_vs_load.csv", "latency_knees.csv", "latency_vs_load_ttft.png",
                 "latency_vs_load_itl.png"):
        assert (tmp_path / name).exists()


def test_kv_budget(tmp_path, load_script):
    exp = load_script("experiments/kv_budget.py")
    table = exp.main(["-n", "400", "--kv-blocks", "1000,2000,8000", "--batch-sizes", "8,256",
                      "-o", str(tmp_path)])
    wide = table[table["max_batch_size"] == 256].set_index("kv_blocks")
    # as the pool shrinks: more preemptions, more prefill recomputed, a longer queue
    assert wide["num_preemptions"].is_monotonic_decreasing
    assert wide.loc[1000, "num_preemptions"] > 0 == wide.loc[8000, "num_preemptions"]
    assert wide["prefill_compute_ratio"].is_monotonic_decreasing
    assert wide.loc[8000, "prefill_compute_ratio"] == 1.0
    assert wide["ttft_p50"].is_monotonic_decreasing
    assert wide.loc[1000, "request_throughput"] < 0.5 * wide.loc[8000, "request_throughput"]
    # ... and the finding appears, with the cheat sheet's advice, only where the pool binds
    assert "kv_pool_too_small" in wide.loc[1000, "findings"].split()
    assert "kv_pool_too_small" not in wide.loc[8000, "findings"].split()
    # with a small pool a larger max batch only adds preemptions: the pool caps the batch
    small = table[table["kv_blocks"] == 1000].set_index("max_batch_size")
    assert small.loc[256, "num_preemptions"] > small.loc[8, "num_preemptions"]
    assert small.loc[256, "mean_batch_size"] < 1.1 * small.loc[8, "mean_batch_size"]
    assert (small["mean_batch_size"] < small["pool_batch"]).all()
    for name in ("kv_budget.csv", "kv_budget.png"):
        assert (tmp_path / name).exists()


def test_capacity_per_gpu(tmp_path, load_script):
    exp = load_script("experiments/capacity_per_gpu.py")
    # prices here are placeholders to check the arithmetic, not claims about any market
    table = exp.main(["-n", "300", "--gpus", "h100,l40s,b200", "--price", "h100=2",
                      "--price", "L40S=1", "-o", str(tmp_path)]).set_index("gpu")
    assert table["fits"].all()
    assert (table["slo_attainment"] >= 0.9).all()
    assert (table["goodput_per_gpu"] <= table["max_rate"]).all()
    # capacity follows bandwidth and KV pool: B200 > H100 > L40S
    assert table.loc["b200", "max_rate"] > 1.5 * table.loc["h100", "max_rate"]
    assert table.loc["l40s", "max_rate"] < 0.5 * table.loc["h100", "max_rate"]
    assert table.loc["h100", "requests_per_usd"] == pytest.approx(
        table.loc["h100", "goodput_per_gpu"] * 3600 / 2)
    assert table.loc["l40s", "usd_per_million_requests"] == pytest.approx(
        1e6 / (table.loc["l40s", "goodput_per_gpu"] * 3600))
    assert table["usd_per_gpu_hour"].isna().tolist() == [False, False, True]
    for name in ("capacity_per_gpu.csv", "capacity_per_gpu.png"):
        assert (tmp_path / name).exists()
    # a model that does not fit is a row of advice, and nothing runs
    big = exp.main(["--model", "llama-3.1-70b", "--gpus", "l40s", "-n", "50"]).set_index("gpu")
    assert not big.loc["l40s", "fits"] and big["max_rate"].isna().all()
    assert "tensor_parallel" in big.loc["l40s", "advice"]
    for bad in (["--price", "h100=-1"], ["--price", "h100"], ["--price", "a100=1",
                                                              "--gpus", "h100"]):
        with pytest.raises(SystemExit) as e:
            exp.main(bad)
        assert e.value.code == 2


def test_memory_budget(tmp_path, load_script):
    exp = load_script("experiments/memory_budget.py")
    t = exp.main(["-o", str(tmp_path)]).set_index(["model", "gpu", "weight_dtype"])["min_tp"]
    assert t[("llama-3.1-70b", "h100", "fp16")] == 4 and t[("llama-3.1-70b", "h100", "fp8")] == 2
    small = t.xs("llama-3.1-8b", level="model")  # one GPU of 40 GB or more suffices; the
    big = [g for g in small.index.get_level_values("gpu") if get_gpu(g).memory_gb >= 40]
    assert (small.loc[big] == 1).all()  # 24 GB ones need 2 GPUs at fp16 (16 GB of weights)
    assert small[("l4", "fp16")] == 2 and small[("l4", "fp8")] == 1
    # narrower weights never need more GPUs (where the wider ones fit at all)
    wide = t.unstack("weight_dtype")
    for a, b in (("fp16", "fp8"), ("fp8", "int4")):
        both = wide[[a, b]].dropna()
        assert (both[b] <= both[a]).all()
        assert wide[b].notna().sum() >= wide[a].notna().sum()
    assert (tmp_path / "memory_budget.csv").exists() and (tmp_path / "memory_budget.png").exists()


def test_plan_8b(tmp_path, load_script):
    exp = load_script("experiments/plan_8b.py")
    table, best = exp.main(["--quick", "-o", str(tmp_path), "--workers", "1"])
    assert list(best.index) == sorted(best.index, key=list(best.index).index)  # (ranked order)
    assert len(best) == 8 and set(best.index) == {f"{g} {lay}" for g in exp.GPUS
                                                  for lay in ("aggregated", "disaggregated")}
    met = best.dropna(subset=["usd_per_hour"])
    assert (met["slo_attainment"] >= 0.99).all() and (met["ttft_p99"] <= 1.0 + 1e-9).all()
    assert met[exp.OBJECTIVE].is_monotonic_increasing  # the table is cheapest first
    # each option's winner is the cheapest of its candidates meeting the SLO
    for option, row in met.iterrows():
        mine = table[(table["option"] == option) & (table["status"] == "ranked")]
        assert row[exp.OBJECTIVE] == mine[exp.OBJECTIVE].min()
    # usd_per_hour: GPUs x the sourced price of the option's GPU
    from sim.specs.economics import gpu_price
    for option, row in met.iterrows():
        price = gpu_price(option.split()[0]).usd_per_gpu_hour
        assert row["usd_per_hour"] == pytest.approx(row["num_gpus"] * price, rel=1e-12)
    for name in ("plan_8b.csv", "plan_8b_best.csv", "plan_8b_pareto.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_autoscaled_day(tmp_path, load_script):
    exp = load_script("experiments/autoscaled_day.py")
    table, runs = exp.main(["--quick", "-o", str(tmp_path)])
    fixed_name = next(n for n in runs if n.startswith("fixed"))
    fixed, auto = runs[fixed_name], runs["autoscaled"]
    n = fixed.policy.max_replicas
    assert table.loc[fixed_name, "slo_attainment"] >= 0.99  # sized to meet it
    # one replica fewer would not have: the fewest that meet it
    if n > 1:
        fewer = exp.sim.run_autoscaled(fixed.result.requests[
            ["arrival_time", "num_prompt_tokens", "num_output_tokens"]], fixed.result.config,
            exp.sim.Autoscaler(min_replicas=n - 1, max_replicas=n - 1))
        assert fewer.summary(slo={"ttft": 1.0})["slo_attainment"] < 0.99
    for run in runs.values():
        s = run.summary()
        assert s["num_finished"] + s["num_rejected"] == len(run.result.requests)  # none lost
        tl = run.timeline
        paid_s = (tl["paid"] * (tl["time"].shift(-1).fillna(run.end) - tl["time"])).sum()
        assert s["gpu_hours"] == pytest.approx(paid_s * 2 / 3600, rel=1e-9)  # TP 2
        assert tl["serving"].min() >= run.policy.min_replicas
    assert table.loc[fixed_name, "cold_start_usd"] == 0 and table.loc["autoscaled",
                                                                      "cold_start_usd"] > 0
    over = pd.read_csv(tmp_path / "over_time.csv")
    assert set(over["fleet"]) == set(runs) and over["slo_attainment"].between(0, 1).all()
    assert (tmp_path / "autoscaled_day.png").stat().st_size > 0
