"""Expert parallelism (sim/costs/expert_parallel.py, the memory budget's weights term): EP 8
holds 1/8 of the experts per GPU, the step time adds the dispatch and combine all-to-alls
priced from DeepEP's measured bandwidth and the busiest GPU's experts, against hand
computations; EP 1 changes nothing."""

import pandas as pd
import pytest

import sim
from sim.costs.expert_parallel import busiest_rank_rows, zipf_share
from sim.costs.moe import expected_busiest
from sim.costs.roofline import RooflineCost
from sim.specs.memory import memory_budget


def test_ep_8_holds_an_eighth_of_the_experts_per_gpu():
    m = sim.get_model("deepseek-v3")  # 58 MoE layers x 256 experts x 3 x 7168 x 2048
    experts = 58 * 256 * 3 * 7168 * 2048
    assert experts == (m.num_hidden_layers - m.num_dense_layers) * m.num_local_experts \
        * m.mlp_params_per_expert()
    rest = m.total_params() - experts
    # data-parallel attention (tensor_parallel 1) over 8 GPUs: every GPU holds all the
    # attention and dense weights and 32 of the 256 experts, fp8 (1 byte)
    b = memory_budget(m, 141, weight_dtype="fp8", expert_parallel=8)
    assert -b.term("weights") == round(rest + experts / 8)
    assert -memory_budget(m, 141 * 8, weight_dtype="fp8").term("weights") == m.total_params()
    # with the attention tensor-parallel over the same 8 GPUs, 1/8 of everything
    tp8 = memory_budget(m, 141, weight_dtype="fp8", tensor_parallel=8, expert_parallel=8)
    assert -tp8.term("weights") == round(rest / 8 + experts / 8)


def test_the_all_to_alls_by_hand():
    # Mixtral-8x7B on 8 H100s (NVLink 450 GB/s per direction), 4,096 tokens in the iteration:
    # each GPU sends 4096 / 8 tokens x top-2 x 7/8 off-GPU x 4096 hidden x 2 bytes
    c = RooflineCost("mixtral-8x7b", "h100", tensor_parallel=8, expert_parallel=8)
    nbytes = 4096 / 8 * 2 * 7 / 8 * 4096 * 2
    assert nbytes == 7_340_032
    dispatch = 20e-6 + nbytes / (450e9 * 153 / 200)  # DeepEP: 153 GB/s of H800's 200
    combine = 20e-6 + nbytes / (450e9 * 158 / 200)
    assert c.all_to_all_time(4096, 153 / 200) == pytest.approx(dispatch, rel=1e-12)
    assert c.all_to_all_time(4096, 158 / 200) == pytest.approx(combine, rel=1e-12)
    # the step: every one of the 32 MoE layers adds them and the experts' difference
    one = RooflineCost("mixtral-8x7b", "h100", tensor_parallel=8)
    gemms = c.expert_parallel_layer_time(4096) - dispatch - combine
    assert c.layers_time(4096) - one.layers_time(4096) == pytest.approx(
        32 * (dispatch + combine + gemms), rel=1e-9)


def test_the_all_to_alls_use_the_groups_own_links_on_a_full_mesh():
    # MI300X's xGMI board is a full mesh: 7 peer links of 64 GB/s per direction
    # (sim/data/scaleup_fabric.csv), 448 GB/s only for the whole board. EP 2 sends its
    # off-GPU half over the one link between the two GPUs, EP 4 over three, EP 8 over seven
    k, h = 1, 5120  # Llama-4-Scout: top-1, hidden 5120
    for ep in (2, 4, 8):
        c = RooflineCost("llama-4-scout", "mi300x", tensor_parallel=ep, expert_parallel=ep)
        nbytes = 4096 / ep * k * (ep - 1) / ep * h * 2
        by_hand = c.params.allreduce_latency_s + nbytes / ((ep - 1) * 64e9 * 153 / 200)
        assert c.all_to_all_time(4096, 153 / 200) == pytest.approx(by_hand, rel=1e-12)
    # a switched fabric gives any group the GPU's whole link: H100 EP 2 moves at 450 GB/s
    c = RooflineCost("mixtral-8x7b", "h100", tensor_parallel=2, expert_parallel=2)
    nbytes = 4096 / 2 * 2 * 1 / 2 * 4096 * 2
    assert c.all_to_all_time(4096, 153 / 200) == pytest.approx(
        c.params.allreduce_latency_s + nbytes / (450e9 * 153 / 200), rel=1e-12)


def test_the_busiest_gpu_by_hand():
    # Mixtral: 8 experts on 8 GPUs, one each; 1,000 tokens x top-2 = 2,000 rows
    assert busiest_rank_rows(1000, 2, 8, 8) == expected_busiest(2000, 1, 8)
    assert 2000 / 8 < busiest_rank_rows(1000, 2, 8, 8) < 2000 / 8 * 1.2
    # Zipf exponent 1: expert 1 gets 1 / H_8 of the picks, H_8 = 1 + 1/2 + ... + 1/8
    h8 = sum(1 / i for i in range(1, 9))
    assert zipf_share(8, 8, 1.0) == pytest.approx(1 / h8)
    assert busiest_rank_rows(1000, 2, 8, 8, skew=1.0) == pytest.approx(2000 / h8)
    # DeepSeek-V3: 256 experts on 8 GPUs, the hottest 32 on GPU 0
    h = [sum(i ** -0.8 for i in range(1, n + 1)) for n in (32, 256)]
    assert busiest_rank_rows(512, 8, 256, 8, skew=0.8) == pytest.approx(4096 * h[0] / h[1])


def test_compute_bound_experts_wait_for_the_busiest_gpu():
    # at 8,192 tokens the experts' GEMMs are compute-bound: skewed routing costs the rows the
    # busiest GPU gets over the mean, at the same rate
    uniform = RooflineCost("mixtral-8x7b", "h100", tensor_parallel=8, expert_parallel=8)
    skewed = RooflineCost("mixtral-8x7b", "h100", tensor_parallel=8, expert_parallel=8,
                          expert_skew=1.0)
    t = 8192
    gemm = lambda c: c.expert_parallel_layer_time(t) - c.all_to_all_time(t, 153 / 200) \
        - c.all_to_all_time(t, 158 / 200)
    rows_u, rows_s = busiest_rank_rows(t, 2, 8, 8), busiest_rank_rows(t, 2, 8, 8, 1.0)
    tp_ops = uniform._times(uniform.op_work(float(t)))
    tp = tp_ops["mlp_up_proj"] + tp_ops["mlp_down_proj"]
    assert (gemm(skewed) + tp) / (gemm(uniform) + tp) == pytest.approx(rows_s / rows_u,
                                                                      rel=0.01)


def test_ep_1_is_the_roofline_and_runs_differ_with_ep():
    df = pd.DataFrame({"arrival_time": [0.0, 0.0], "num_prompt_tokens": [512, 700],
                       "num_output_tokens": [64, 64]})
    base = dict(model="mixtral-8x7b", gpu="h100", tensor_parallel=8)
    a = sim.run(df, **base)
    b = sim.run(df, **base, expert_parallel=1)
    assert a.requests["finish_time"].tolist() == b.requests["finish_time"].tolist()
    ep = sim.run(df, **base, expert_parallel=8)
    assert ep.requests["finish_time"].tolist() != a.requests["finish_time"].tolist()
    assert "ep=8" in repr(sim.SimConfig(**base, expert_parallel=8).resolved_cost_model())


@pytest.mark.parametrize("kw, message", [
    (dict(model="llama-3.1-8b", tensor_parallel=2, expert_parallel=2),
     "expert_parallel 2 needs a mixture-of-experts model"),
    (dict(model="mixtral-8x7b", tensor_parallel=4, expert_parallel=8),
     "expert_parallel 8 must equal tensor_parallel 4"),
    (dict(model="mixtral-8x7b", tensor_parallel=4, expert_parallel=4, expert_skew=-1),
     "expert_skew must be a Zipf exponent >= 0"),
    (dict(model="mixtral-8x7b", expert_skew=1.0), "expert_skew 1.0 needs expert_parallel > 1"),
    # a dense model: named as dense, not sent to give --ep N, which is then refused too
    (dict(model="llama-3.1-8b", attention_dp=2),
     "^attention_dp 2 needs a mixture-of-experts model \\(the experts spread over its "
     "ranks\\); 'llama-3.1-8b' is dense$"),
    (dict(model="llama-3.1-8b", expert_parallel=4, attention_dp=2),
     "^expert_parallel 4 needs a mixture-of-experts model; 'llama-3.1-8b' is dense$"),
    (dict(model="qwen3-30b-a3b", tensor_parallel=4, expert_parallel=0),
     "expert_parallel must be"),
    # GB200 NVL72: a 72-GPU domain, so 16 ranks pass the scale-up check and meet this one
    (dict(model="mixtral-8x7b", gpu="gb200", tensor_parallel=16, expert_parallel=16),
     "^expert_parallel 16 must divide the 8 experts of 'mixtral-8x7b'$"),
    (dict(model="mixtral-8x7b", tensor_parallel=16, expert_parallel=16),
     "^tensor_parallel 16 is more GPUs than one scale-up domain of H100-80GB-SXM holds"),
])
def test_bad_expert_parallel_settings_are_one_line_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        sim.SimConfig(**kw)


def test_expert_skew_with_a_cost_model_that_cannot_price_it_is_an_error():
    """Only the roofline prices the busiest GPU's experts: a constant cost would run as if
    routing were uniform, the skew dropped without a word."""
    from sim.costs.simple import ConstantCost
    cfg = sim.SimConfig(model="mixtral-8x7b", tensor_parallel=8, expert_parallel=8,
                        expert_skew=1.0, cost_model=ConstantCost(0.01))
    with pytest.raises(ValueError, match="^expert_skew=1 is not used by cost_model Constant"):
        cfg.resolved_cost_model()
    own = RooflineCost("mixtral-8x7b", "h100", tensor_parallel=8, expert_parallel=8,
                       expert_skew=1.0)  # a roofline of the same skew prices it
    assert sim.SimConfig(model="mixtral-8x7b", tensor_parallel=8, expert_parallel=8,
                         expert_skew=1.0, cost_model=own).resolved_cost_model() is own
