import numpy as np
import pandas as pd
import pytest

from sim.engine import run
from sim.costs.executor import ExecutedCost, Executor
from sim.costs.kernels import (array_module, paged_decode_attention, prefill_chunk_attention,
                         scaled_dot_product_attention, tiled_softmax_dot)
from sim.specs.models import ModelConfig

TINY = ModelConfig("t", 2, 64, 4, 2, 96, 50)


def test_paged_decode_attention_equals_tiled_softmax_and_reference(rng):
    b, nh, nkv, d, bs = 4, 6, 3, 8, 4
    k_pool, v_pool = rng.normal(size=(40, bs, nkv, d)), rng.normal(size=(40, bs, nkv, d))
    tables = rng.permutation(40)[:4 * 5].reshape(4, 5)
    lens = np.array([1, 7, 20, 13])
    q = rng.normal(size=(b, nh, d))
    out = paged_decode_attention(q, k_pool, v_pool, tables, lens)
    for i in range(b):
        keys = k_pool[tables[i]].reshape(-1, nkv, d)[:lens[i]]
        vals = v_pool[tables[i]].reshape(-1, nkv, d)[:lens[i]]
        for h in range(nh):
            kv = h // (nh // nkv)
            np.testing.assert_allclose(out[i, h], tiled_softmax_dot(q[i, h] / np.sqrt(d),
                                                                    keys[:, kv], vals[:, kv]),
                                       rtol=1e-10)
            np.testing.assert_allclose(out[i, h], scaled_dot_product_attention(
                q[i, h][None], keys[:, kv], vals[:, kv])[0], rtol=1e-10)


def test_prefill_chunk_attention_is_causal_over_the_prefix(rng):
    q, k, v = rng.normal(size=(3, 4, 8)), rng.normal(size=(10, 2, 8)), rng.normal(size=(10, 2, 8))
    out = prefill_chunk_attention(q, k, v)
    for h in range(4):
        ref = scaled_dot_product_attention(q[:, h], k[:, h // 2], v[:, h // 2], causal=True)
        np.testing.assert_allclose(out[:, h], ref, rtol=1e-10)
    # the first query of the chunk does not see the chunk's later keys
    k2 = k.copy()
    k2[8:] += 100
    assert np.allclose(prefill_chunk_attention(q, k2, v)[0], out[0])


def test_executor_chunked_prefill_and_decodes_equal_full_recomputation(rng):
    ex = Executor(TINY, num_blocks=64, block_size=4, dtype="float64")
    toks = rng.integers(0, 50, 13)
    plan = ex._plan([("full", 13, 0)], [])
    plan["tokens"] = np.asarray(toks)
    full = ex.forward(plan)
    outs = []
    for chunk, cached in ((5, 0), (4, 5)):
        plan = ex._plan([("inc", chunk, cached)], [])
        plan["tokens"] = np.asarray(toks[cached:cached + chunk])
        outs.append(ex.forward(plan))
    for j in range(9, 13):  # decodes through the paged cache
        plan = ex._plan([], [("inc", j + 1)])
        plan["tokens"] = np.asarray(toks[j:j + 1])
        outs.append(ex.forward(plan))
    np.testing.assert_allclose(np.concatenate(outs), full, rtol=1e-9, atol=1e-12)
    assert len(ex.tables["inc"]) == 4  # 13 tokens in blocks of 4
    ex.release("inc")
    assert "inc" not in ex.tables and len(ex.free) == 64 - 4


def test_executed_cost_runs_the_engine_schedule_for_real():
    ex = Executor(TINY, num_blocks=256, block_size=16)
    predicted = []
    ec = ExecutedCost(ex, predictor=lambda b: predicted.append(b.num_tokens) or 0.001)
    df = pd.DataFrame({"arrival_time": [0.0, 0.0, 0.01], "num_prompt_tokens": [40, 70, 20],
                       "num_output_tokens": [5, 3, 4]})
    res = run(df, cost_model=ec, scheduler="chunked", chunk_size=32, max_batch_size=4,
              kv_blocks=200)
    assert (res.requests["status"] == "finished").all()
    rec = np.asarray(ec.records)
    assert len(rec) == len(res.iterations)
    np.testing.assert_allclose(res.iterations["duration"], rec[:, 0])  # the measured times
    assert (rec[:, 0] > 0).all()
    assert predicted == (res.iterations["num_prefill_tokens"]
                         + res.iterations["num_decode_tokens"]).tolist()
    # finished requests' blocks are released at the next call; nothing leaks
    assert len(ex.free) + sum(len(t) for t in ex.tables.values()) == 256
    assert len(ex.tables) <= 1


def test_array_module_falls_back_to_numpy_without_gpu():
    xp, name = array_module("cpu")
    assert xp is np and name.startswith("cpu")
    with pytest.raises(ValueError, match="device"):
        array_module("tpu")


@pytest.mark.gpu
def test_cupy_paged_kernel_matches_numpy(load_script):
    cupy = pytest.importorskip("cupy")
    if not cupy.cuda.is_available():
        pytest.skip("no CUDA GPU")
    gpu_check = load_script("experiments/gpu_check.py")
    result = gpu_check.check_kernels(cupy)
    assert result["passed"], result
