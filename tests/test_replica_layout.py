"""A replica's GPUs and each GPU's weight bytes (sim/specs/replica_layout.py), against hand
computations and the memory budget."""

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.specs.memory import memory_budget
from sim.specs.models import model_presets
from sim.specs.replica_layout import replica_gpus, routed_expert_params, weight_bytes_per_gpu


def test_a_replica_is_tp_gpus_or_tp_x_attention_dp():
    assert replica_gpus(1) == 1 and replica_gpus(4) == 4
    assert replica_gpus(2, 4) == 8 and replica_gpus(1, 8) == 8
    cfg = sim.SimConfig(model="mixtral-8x7b", gpu="h100", tensor_parallel=2,
                        expert_parallel=8, attention_dp=4)
    assert cfg.replica_gpus() == 8 and cfg.fleet() == (1, 8)
    assert sim.SimConfig(tensor_parallel=2, replicas=3).fleet() == (3, 6)


def test_a_dense_model_splits_its_weights_over_tp():
    m = sim.get_model("llama-3.1-8b")
    assert routed_expert_params(m) == 0
    # the same float operations as the memory budget's (and the autoscaler's) before
    assert weight_bytes_per_gpu(m, 2, 2.0) == m.total_params() * 2.0 / 2


def test_moe_weights_by_hand():
    # Mixtral-8x7B: 32 layers x 8 experts x 3 x 4096 x 14336 routed-expert weights
    m = sim.get_model("mixtral-8x7b")
    experts = 32 * 8 * 3 * 4096 * 14336
    assert routed_expert_params(m) == experts
    rest = m.total_params() - experts
    assert weight_bytes_per_gpu(m, 2, 1.0, 8) == pytest.approx(rest / 2 + experts / 8)
    # experts in their own precision (0.53125 B: mxfp4 with its scales), over EP or over TP
    assert weight_bytes_per_gpu(m, 1, 2.0, 8, 0.53125) == pytest.approx(
        rest * 2 + experts / 8 * 0.53125)
    assert weight_bytes_per_gpu(m, 4, 2.0, 1, 0.53125) == pytest.approx(
        rest / 4 * 2 + experts / 4 * 0.53125)


MOE = [n for n in model_presets() if sim.get_model(n).is_moe]


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(MOE), ep=st.sampled_from([1, 2, 4, 8]),
       wb=st.sampled_from([2.0, 1.0]), eb=st.sampled_from([None, 0.53125]))
def test_the_memory_budget_holds_these_bytes_and_every_weight_at_least_once(name, ep, wb, eb):
    m = sim.get_model(name)
    if m.num_local_experts % ep:
        return
    per_gpu = weight_bytes_per_gpu(m, 1, wb, ep, eb)
    b = memory_budget(m, 1000.0, weight_dtype=wb, expert_parallel=ep, expert_weight_dtype=eb)
    assert -b.term("weights") == round(per_gpu)
    total = (m.total_params() - routed_expert_params(m)) * wb \
        + routed_expert_params(m) * (wb if eb is None else eb)
    assert per_gpu * ep >= total * (1 - 1e-12)  # ep GPUs (attention TP 1): all of it
