"""The engine's KV pool per layer kind (sim/engine/kv/layer_groups.py, core/windowed_decodes.py):
a sliding-window model's blocks stop growing past the window, a linear-attention model's state
is a constant charge, chunked-local layers free each past chunk; the decode tracker's block
needs equal a brute-force sum; runs under a tight pool keep the invariants and lose nothing."""

import itertools
import random

import pandas as pd
import pytest

import sim
import workloads
from sim.engine.core.request import Request
from sim.engine.core.windowed_decodes import WindowedDecodes
from sim.engine.kv.layer_groups import LayerPool
from sim.engine.fleet.cluster import layer_pool
from sim.specs.layers import linear_state_values
from sim.specs.models import ModelConfig

# Mistral-7B v0.1's config.json (every layer sliding over 4,096 tokens), its window made 256
MISTRAL_V01 = {"model_type": "mistral", "architectures": ["MistralForCausalLM"],
               "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
               "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
               "max_position_embeddings": 32768, "sliding_window": 256,
               "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def one_request(prompt, output):
    return pd.DataFrame({"arrival_time": [0.0], "num_prompt_tokens": [prompt],
                         "num_output_tokens": [output]})


def used(model, prompt=100, output=1200, **kw):
    res = sim.run(one_request(prompt, output), model=model, gpu="h200", check=True, **kw)
    return res.iterations["kv_blocks_used"].to_numpy()


def test_an_all_sliding_model_stops_growing_at_its_window():
    m = ModelConfig.from_hf(MISTRAL_V01, name="mistral-7b-v0.1-w256")
    u = used(m)
    # iteration 0 prefills 100 tokens: 7 blocks; decode step i writes token 100 + i
    assert u[0] == 7
    # past the window: ceil(c / 16) - (c - 256) // 16 blocks, 16 or 17, whatever c
    tail = u[300:]
    assert set(tail) <= {16, 17} and 17 in tail
    for i in (300, 700, 1199):
        c = 100 + i
        assert u[i] == -(-c // 16) - (c - 256) // 16
    # the plain pool (every layer counted for every token) grows to ceil(1300 / 16) = 82
    plain = used(m, prefix_caching="block")
    assert plain[-1] == -(-1299 // 16)


def test_gpt_oss_grows_by_its_full_layers_only():
    u = used("gpt-oss-20b")  # 12 full + 12 sliding(128) layers, block_size 16: 24 pages
    for i in (0, 200, 1199):
        c = 100 + i
        kept = -(-c // 16) - max(0, c - 128) // 16
        assert u[i] == -(-(12 * -(-c // 16) + 12 * kept) // 24), i
    assert u[-1] < used("gpt-oss-20b", prefix_caching="block")[-1]


def test_a_linear_attention_models_state_is_a_constant_charge():
    m = sim.get_model("qwen3-next-80b-a3b")  # 12 full + 36 Gated DeltaNet layers
    cfg = sim.SimConfig(model=m.name, gpu="h200", tensor_parallel=4).resolved()
    pool = layer_pool(cfg)
    page = 16 * m.kv_values_per_token_per_layer(4) * 2  # block_size x K,V of a layer, fp16
    assert pool.state_pages == -(-36 * linear_state_values(m, 4) * 2 // page)
    u = used(m.name, tensor_parallel=4)
    state = u - [-(-(100 + i) // 16) for i in range(len(u))]  # minus the full layers' blocks
    assert set(state) == {-(-pool.state_pages // 12)}


def test_chunked_local_layers_free_each_past_chunk():
    pool = LayerPool(16, full=0, local=4, chunk=64)
    # c tokens, c - 1 computed: the blocks of the current chunk, (c - 1) % 64 + 1 tokens
    assert [pool.held(c) for c in (1, 16, 17, 64, 65, 66, 128, 129)] == [1, 1, 2, 4, 1, 1, 4, 1]


@pytest.mark.parametrize("pool", [
    LayerPool(16, full=12, local=12, window=128),
    LayerPool(16, full=10, local=52, window=1000),
    LayerPool(8, full=1, local=3, chunk=40),
    LayerPool(16, full=12, state_pages=409),
    LayerPool(4, full=0, local=5, window=9, state_pages=3)], ids=str)
def test_next_change_finds_every_change_and_bound_holds(pool):
    for c in range(0, 600):
        brute = next((x for x in range(c + 1, 700) if pool.held(x) != pool.held(x - 1)), None)
        assert pool.next_change(c, 699) == brute, c
        assert pool.held(c) <= pool.bound(c) <= pool.bound(c + 1)


def test_decodes_need_the_sum_of_their_changes():
    pool = LayerPool(16, full=2, local=6, window=40, state_pages=3)
    d = WindowedDecodes(16, pool)
    rng = random.Random(1)
    live = []
    for i in range(400):
        if rng.random() < 0.3:
            r = _Req(len(live) + 1000 * i, rng.randint(1, 90), rng.randint(1, 200))
            r.num_computed, r.num_generated = r.num_prompt_tokens, 1
            d.start(r, i - 1)
            live.append(r)
        if live and rng.random() < 0.1:
            d.stop(live.pop(rng.randrange(len(live))), i - 1)
        live = [r for r in live if r.finish_iteration >= i]
        want = sum(pool.held(c) - pool.held(c - 1) for c in
                   (r.decode_base_tokens + i - r.decode_start for r in live))
        assert d.blocks_needed(i) == want, i
        for r in [r for r in live if r.finish_iteration == i]:
            assert d.finish(r, i) == pool.held(r.decode_base_tokens + i - r.decode_start)
            live.remove(r)


def _Req(index, prompt, output):
    """A request the decode tracker can take (the engine's own class: compiled, its
    tracker accepts no other)."""
    return Request(index, index, 0.0, prompt, output)


@pytest.mark.parametrize("scheduler, model", list(itertools.product(
    ["chunked", "vllm", "sglang", "tensorrt-llm", "static"],
    ["gpt-oss-20b", "llama-4-scout", "qwen3-next-80b-a3b"])))
def test_tight_pools_keep_the_invariants_and_lose_nothing(scheduler, model):
    df = workloads.synthetic(60, rate=50.0, prompt=workloads.Uniform(200, 900),
                             output=workloads.Uniform(50, 400), seed=3)
    kw = dict(model=model, gpu="h200", tensor_parallel=4, scheduler=scheduler, kv_tokens=6400,
              check=True)
    res = sim.run(df, **kw)
    reqs = res.requests
    assert len(reqs) == len(df)
    assert reqs["finish_time"].notna().sum() + (reqs["status"] == "rejected").sum() == len(df)
    assert res.requests["num_preemptions"].sum() > 0 or scheduler in ("sglang", "static",
                                                                      "tensorrt-llm")


def test_fast_forward_is_off_for_a_layer_pool_and_on_for_the_plain_one():
    # a stretch reads the decodes' block phases (one block per block_size steps each); a
    # layer pool's decodes take and free blocks off-phase, so its replicas are stepped
    from sim.engine.core.fastforward import can_fast_forward
    from sim.engine.fleet.cluster import new_replica
    from sim.engine.schedulers import resolve
    for model, plain in (("gpt-oss-20b", False), ("llama-3.1-8b", True)):
        cfg, policy = resolve(sim.SimConfig(model=model, gpu="h200").resolved())
        rep = new_replica(cfg, policy, 1000)
        assert (rep.layers is None) is plain
        assert can_fast_forward(policy, rep) is plain
