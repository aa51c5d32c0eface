"""Data-parallel attention under expert parallelism (sim/costs/dp_attention.py): the memory per
GPU, the replica's pool and GPUs, and the step time of known batches, against hand
computations."""

import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.costs.expert_parallel import COMBINE_EFF, DISPATCH_EFF
from sim.costs.dp_attention import DPAttentionCost
from sim.costs.roofline import RooflineCost
from sim.specs.memory import memory_budget

MIXTRAL = dict(model="mixtral-8x7b", gpu="h100")


class Batch:
    """What the roofline reads of a batch: prefill chunks ``(new, cached)``, decode contexts."""

    def __init__(self, prefills=(), decodes=()):
        self.prefills = tuple(prefills)
        self.num_prefill_tokens = sum(n for n, _ in self.prefills)
        self._decodes = list(decodes)
        self.num_decode_tokens = len(self._decodes)
        self.decode_context_tokens = sum(self._decodes)
        self.num_spec_tokens = 0

    def decode_context_lengths(self):
        return self._decodes


def test_each_gpu_holds_the_attention_whole_and_an_eighth_of_the_experts():
    # Mixtral-8x7B: 32 layers x 8 experts x 3 x 4096 x 14336 expert weights, the rest
    # (attention, embeddings, norms, routers) replicated on each of the 8 ranks (attention TP 1)
    m = sim.get_model("mixtral-8x7b")
    experts = 32 * 8 * 3 * 4096 * 14336
    rest = m.total_params() - experts
    b = memory_budget(m, 85.9, weight_dtype="fp8", expert_parallel=8)
    assert -b.term("weights") == round(rest + experts / 8)
    # attention TP 2 within each of 4 ranks: half the rest per GPU, still 1/8 of the experts
    b2 = memory_budget(m, 85.9, weight_dtype="fp8", tensor_parallel=2, expert_parallel=8)
    assert -b2.term("weights") == round(rest / 2 + experts / 8)
    # the replica's pool: each rank's KV blocks (one GPU's at TP 1), 8 ranks of them
    cfg = sim.SimConfig(**MIXTRAL, weight_dtype="fp8", expert_parallel=8, attention_dp=8)
    one = memory_budget(m, sim.get_gpu("h100").memory_gb, weight_dtype="fp8",
                        kv_dtype="fp16", expert_parallel=8, block_size=16)
    assert cfg.resolved_kv_blocks() == 8 * one.kv_blocks
    # a rank of TP 1 holds all 8 KV heads of its tokens: 2 x 32 x 8 x 128 x 2 B per token
    assert one.kv_block_bytes_per_gpu == 16 * 2 * 32 * 8 * 128 * 2


def test_the_replica_is_ep_gpus_and_pays_for_all_of_them():
    cfg = sim.SimConfig(**MIXTRAL, tensor_parallel=2, expert_parallel=8, attention_dp=4,
                        usd_per_gpu_hour=2.0)
    assert cfg.fleet() == (1, 8)
    df = pd.DataFrame({"arrival_time": [0.0] * 4, "num_prompt_tokens": [300] * 4,
                       "num_output_tokens": [8] * 4})
    s = sim.run(df, cfg).summary()
    assert s["num_finished"] == 4 and s["num_gpus"] == 8
    assert s["usd_per_hour"] == 8 * 2.0


def test_a_decode_batch_by_hand():
    # 512 decodes of 1,000 context tokens on 8 ranks of one H100 each: every rank runs 64
    # sequences through its whole attention weights and the LM head; the experts take all 512
    c = DPAttentionCost(**MIXTRAL, expert_parallel=8, attention_dp=8)
    plain = RooflineCost(**MIXTRAL)  # one GPU, every weight on it, no EP
    p, m = c.params, sim.get_model("mixtral-8x7b")
    b = Batch(decodes=[1000] * 512)
    # attention: 512,000 context tokens' K and V (8 heads x 128 x 2 B, 32 layers) over 8 ranks
    per_ctx = 32 * 2 * 8 * 128 * 2 / (c.bw * p.attn_decode_memory_eff)
    assert c._decode_s_per_ctx == pytest.approx(per_ctx, rel=1e-12)  # memory-bound
    attention = 512_000 * per_ctx / 8
    # dispatch and combine: each GPU sends 512 / 8 tokens x top-2 x 7/8 off-GPU x 4096 x 2 B
    nbytes = 512 / 8 * 2 * 7 / 8 * 4096 * 2
    link = sim.get_gpu("h100").link_bandwidth_gbps * 1e9
    a2a = (2 * p.allreduce_latency_s + nbytes / (link * DISPATCH_EFF)
           + nbytes / (link * COMBINE_EFF))
    # the experts: the busiest GPU's GEMMs over all 512 tokens, in place of one rank's 64
    up, down = c.expert_gemms_ep(512.0, 64.0)
    ep_ops = c._times({"moe_router": (0.0, 0.0), "mlp_up_proj": up, "mlp_down_proj": down,
                       "add": (0.0, 0.0)})
    tp_ops = c._times(c.op_work(64.0))
    experts = (ep_ops["mlp_up_proj"] + ep_ops["mlp_down_proj"]
               - tp_ops["mlp_up_proj"] - tp_ops["mlp_down_proj"])
    assert c.expert_parallel_layer_time(512) == pytest.approx(a2a + experts, rel=1e-12)
    # everything else: one rank's 64 tokens on one GPU, the single-GPU roofline's own price
    head = plain.lm_head_time(64)
    fixed = p.overhead_s + p.overhead_per_seq_s * 512  # a CUDA-graph decode batch (<= 512)
    hand = plain.layers_time(64) + 32 * (a2a + experts) + head + fixed + attention
    assert c(b) == pytest.approx(hand, rel=1e-9)
    assert c.pure_decode_cost(512)(b.decode_context_tokens) == c(b)  # (the fast-forward)


def test_a_long_prefill_is_not_split_over_the_ranks():
    # one 8,192-token prefill beside 7 short decodes: the chunk's rank does all its attention
    c = DPAttentionCost(**MIXTRAL, expert_parallel=8, attention_dp=8)
    alone = Batch(prefills=[(8192, 0)])
    b = Batch(prefills=[(8192, 0)], decodes=[100] * 7)
    whole = c.attention_time(alone)
    assert whole > c.attention_time(b) / 8
    assert c(b) == pytest.approx(c.non_attention_time(b) + whole, rel=1e-12)
    # many equal short prefills: the even share
    many = Batch(prefills=[(256, 0)] * 64)
    assert c.busiest_rank_attention(many) == pytest.approx(c.attention_time(many) / 8)


def test_dp_attention_beats_tp_attention_on_a_long_context_decode_batch():
    # MLA (DeepSeek-V3): at TP 8 every GPU reads every sequence's whole latent; with 8 ranks
    # each reads its own eighth of them
    kw = dict(model="deepseek-v3", gpu="h200", weight_dtype="fp8", expert_parallel=8)
    tp = RooflineCost(**kw, tensor_parallel=8)
    dp = DPAttentionCost(**kw, attention_dp=8)
    b = Batch(decodes=[8000] * 256)
    at_tp8 = 256 * 8000 * tp._decode_s_per_ctx  # every GPU: all 256 sequences, 16 heads
    # a rank: its 32 sequences with all 128 heads (the absorbed form's FLOPs grow 8x, the
    # latent's bytes do not), so less than a quarter of the TP-8 time
    assert dp.busiest_rank_attention(b) == pytest.approx(32 * 8000 * dp._decode_s_per_ctx,
                                                         rel=1e-9)
    assert dp.busiest_rank_attention(b) < at_tp8 / 4


@pytest.mark.parametrize("kw, message", [
    (dict(model="mixtral-8x7b", tensor_parallel=2, expert_parallel=8, attention_dp=8),
     "^attention_dp 8 needs expert_parallel 16 \\(tensor_parallel 2 x 8 ranks\\), got 8: "),
    (dict(model="llama-3.1-8b", expert_parallel=2, attention_dp=2),
     "expert_parallel 2 needs a mixture-of-experts model"),
    (dict(model="mixtral-8x7b", attention_dp=0), "attention_dp must be"),
    (dict(model="mixtral-8x7b", expert_parallel=2, attention_dp=2,
          speculative=sim.SpeculativeConfig(method="ngram", num_speculative_tokens=2)),
     "^attention_dp=2 with speculative decoding \\(speculative\\) is not modelled$"),
])
def test_bad_settings_are_one_line_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        sim.SimConfig(**kw)


def test_attention_dp_1_is_the_roofline():
    b = Batch(prefills=[(700, 100)], decodes=[500] * 30)
    tp = RooflineCost(**MIXTRAL, tensor_parallel=8, expert_parallel=8)
    one = DPAttentionCost(**MIXTRAL, tensor_parallel=8, expert_parallel=8, attention_dp=1)
    assert one(b) == pytest.approx(tp(b), rel=1e-12)
    with pytest.raises(ValueError, match="^attention_dp 8: data-parallel attention prices"):
        RooflineCost(**MIXTRAL, expert_parallel=8, attention_dp=8)
    cfg = sim.SimConfig(**MIXTRAL, expert_parallel=8, attention_dp=8)
    assert type(cfg.resolved_cost_model()) is DPAttentionCost
    assert "dp_attention=8" in repr(DPAttentionCost(**MIXTRAL, expert_parallel=8, attention_dp=8))


def test_the_cli_runs_dp_attention_and_refuses_a_bad_split(tmp_path, capsys):
    from sim.cli.main import main
    out = str(tmp_path / "r")
    assert main(["run", "--model", "mixtral-8x7b", "--ep", "8", "--dp-attention", "4", "--tp",
                 "2", "-n", "5", "-o", out]) == 0
    capsys.readouterr()
    assert main(["run", "--model", "mixtral-8x7b", "--ep", "8", "--dp-attention", "8", "--tp",
                 "2", "-n", "5", "-o", out + "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--dp-attention 8 needs expert_parallel 16" in err


def test_a_fit_profile_keeps_dp_attention_and_the_experts_dtype(tmp_path, capsys):
    """--profile FIT.json builds the fitted roofline: it must not drop --dp-attention or
    --expert-dtype (a cost model that cannot price them is refused, not run)."""
    import json
    from sim.cli.main import main
    from sim.costs.fitted import FIT_FORMAT
    p = tmp_path / "fit.json"
    p.write_text(json.dumps({"format": FIT_FORMAT, "terms": {
        "compute_eff_scale": 0.5, "memory_eff_scale": 0.7, "overhead_s": 0.001}}))
    assert main(["run", "--model", "gpt-oss-20b", "--ep", "4", "--dp-attention", "4",
                 "--weight-dtype", "bf16", "--expert-dtype", "checkpoint", "--profile", str(p),
                 "-n", "5", "--rate", "1", "-o", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "ep=4, dp_attention=4, weights=bf16, experts=mxfp4, params(" in out
    with pytest.raises(ValueError, match="^attention_dp=8 with a cost model that does not"):
        sim.SimConfig(**MIXTRAL, expert_parallel=8, attention_dp=8,
                      cost_model=RooflineCost(**MIXTRAL, tensor_parallel=8, expert_parallel=8))
    with pytest.raises(ValueError, match="^expert_weight_dtype='mxfp4' is not used by cost_model"):
        sim.SimConfig(model="gpt-oss-20b", expert_weight_dtype="mxfp4",
                      cost_model=RooflineCost("gpt-oss-20b", "h100"))


@settings(max_examples=150, deadline=None)
@given(layout=st.sampled_from([("mixtral-8x7b", 1, 8), ("mixtral-8x7b", 2, 4),
                               ("deepseek-v3", 1, 8), ("qwen3-30b-a3b", 2, 2)]),
       gpu=st.sampled_from(["h100", "b200"]),
       contexts=st.lists(st.integers(1, 40_000), min_size=1, max_size=40),
       copies=st.sampled_from([1, 7, 20]))
def test_the_pure_decode_price_is_the_batch_price_bit_for_bit(layout, gpu, contexts, copies):
    # the fast-forward's price of a decode batch (sim.engine.core.batch's contract), small
    # batches (a CUDA graph) and past cuda_graph_max_batch (eager), short and long contexts
    # (the busiest rank's attention at its floor or above it)
    model, tp, dp = layout
    cost = DPAttentionCost(model, gpu, tensor_parallel=tp, expert_parallel=tp * dp,
                           attention_dp=dp)
    decodes = contexts * copies
    batch = Batch(decodes=decodes)
    assert cost.pure_decode_cost(len(decodes))(sum(decodes)) == cost(batch)


def test_the_pure_decode_price_over_a_grid_of_batches():
    # the busiest rank's attention rounds apart from a simpler sum in ~1 % of batches: a
    # grid of 3,000 finds those a hypothesis sample may miss
    import numpy as np
    rng = np.random.default_rng(0)
    cost = DPAttentionCost(**MIXTRAL, expert_parallel=8, attention_dp=8)
    for n in rng.integers(1, 1100, size=3000).tolist():
        decodes = rng.integers(1, 40_000, size=n).tolist()
        assert cost.pure_decode_cost(n)(sum(decodes)) == cost(Batch(decodes=decodes))


def test_a_dp_attention_run_is_fast_forwarded():
    from sim.engine.core.batch import decode_pricer
    cost = DPAttentionCost(**MIXTRAL, expert_parallel=8, attention_dp=8)
    assert decode_pricer(cost) is not None
    # a model with sliding-window layers prices decodes per layer kind: stepped, as the roofline
    swa = DPAttentionCost("gpt-oss-120b", "h100", expert_parallel=8, attention_dp=8)
    assert decode_pricer(swa) is None
