"""sim/specs/memory_terms.py and memory_budget's accounting: each term by its own arithmetic,
the vLLM terms against the start-up peaks llm-d published, SGLang's mem_fraction_static,
TensorRT-LLM's free-memory fraction."""

import dataclasses

import pytest

import sim
from sim import get_model, memory_budget
from sim.cli import main
from sim.specs.gpus import get_gpu
from sim.specs.memory_terms import (GiB, MiB, SAMPLER_BYTES_PER_LOGIT, forward_peak_bytes,
                                    kv_heads_per_gpu, sampler_peak_bytes,
                                    sglang_mem_fraction_static, trtllm_non_torch_bytes,
                                    vllm_activation_peak_bytes, vllm_non_torch_bytes)

A100 = 81920 * MiB  # nvidia-smi memory.total of an A100-SXM4-80GB


def test_llama2_70b_tp2_on_a100_is_the_sum_of_the_vllm_terms():
    """The issue's figure, by hand: per GPU of the two."""
    b = memory_budget("llama-2-70b", get_gpu("a100").memory_gb, tensor_parallel=2,
                      gpu_memory_utilization=0.9)
    m = get_model("llama-2-70b")  # h 8192, I 28672, 80 layers, 8 KV heads of 128, vocab 32000
    requested = round(0.9 * A100)                                  # 77,309,411,328
    weights = m.total_params() * 2 // 2                            # 68,976,648,192
    forward = 8192 * (2 * 8192 + 3 * 28672 // 2) * 2               # MLP of 8,192 tokens
    sampler = 8192 * 8192 * 2 + round(256 * 32000 * SAMPLER_BYTES_PER_LOGIT)
    assert forward == 973_078_528 and sampler == 448_790_528  # the forward pass is the peak
    non_torch = round(0.55 * GiB)                                  # TP 2, measured by llm-d
    kv = requested - weights - forward - non_torch
    block = 16 * 80 * 2 * (8 // 2) * 128 * 2                       # 16 tokens, K and V, 4 heads
    assert (kv, block) == (6_769_126_605, 2_621_440)
    assert b.kv_blocks == kv // block == 2582
    assert [t.name for t in b.terms] == ["requested", "weights", "activations", "non_torch"]
    assert [t.bytes for t in b.terms] == [requested, -weights, -forward, -non_torch]
    assert b.kv_bytes_per_gpu == kv and b.kv_budget_bytes == 2 * kv
    assert b.max_kv_tokens == kv // (block // 16)
    assert b.device_memory_bytes == A100
    # roughly twice the 1,153 blocks of 80 GB = 80e9 bytes with nothing but the weights
    assert 1.9 < b.kv_blocks / 1153 < 2.5


def test_terms_add_up_and_totals_are_per_gpu_times_tp():
    for tp in (1, 2, 4):
        b = memory_budget("llama-3.1-8b", get_gpu("h100").memory_gb, tensor_parallel=tp)
        assert sum(t.bytes for t in b.terms) == b.kv_bytes_per_gpu
        assert b.kv_budget_bytes == tp * b.kv_bytes_per_gpu
        assert b.usable_bytes == tp * b.term("requested")
        assert b.overhead_bytes == -tp * (b.term("activations") + b.term("non_torch"))
        assert b.kv_blocks == b.kv_bytes_per_gpu // b.kv_block_bytes_per_gpu
    with_reserve = memory_budget("llama-3.1-8b", 80, overhead_gb=2)
    assert with_reserve.term("reserved") == -2e9
    assert with_reserve.kv_bytes_per_gpu == memory_budget("llama-3.1-8b", 80).kv_bytes_per_gpu \
        - 2e9


@pytest.mark.parametrize("model, tp, measured_gib", [
    ("llama-3.1-8b", 1, 4.76),   # llm-d: Llama-3.1-8B-Instruct
    ("llama-3.1-70b", 2, 4.84),  # llm-d: Llama-3.3-70B-FP8 (same shapes; activations bf16)
])
def test_vllm_activation_peak_matches_llm_d_measurements(model, tp, measured_gib):
    """vllm serve on an H100 (8,192 tokens, 1,024 sequences): the sampler-bound peaks that
    SAMPLER_BYTES_PER_LOGIT was fitted to, within 1%."""
    peak = vllm_activation_peak_bytes(get_model(model), 8192, 1024, tp)
    assert peak / GiB == pytest.approx(measured_gib, rel=0.01)


def test_vllm_kv_cache_matches_llm_d_llama_8b():
    """llm-d's H100 log: 79.18 GiB total (cudaMemGetInfo), 0.9, weights 14.99 GiB, activation
    4.76, non-torch 0.13 -> 51.38 GiB of KV cache."""
    b = memory_budget("llama-3.1-8b", 79.18 * GiB / 1e9, max_num_seqs=1024)
    assert b.kv_bytes_per_gpu / GiB == pytest.approx(51.38, abs=0.06)


def test_forward_peak_is_the_larger_live_set_of_a_layer():
    m = get_model("llama-3.1-8b")  # h 4096, 32 heads, 8 KV heads of 128, I 14336
    mlp = 2 * 4096 + 3 * 14336
    attention = 2 * 4096 + (32 + 2 * 8) * 128 + 32 * 128
    assert mlp > attention
    assert forward_peak_bytes(m, 100, 1) == 100 * mlp * 2
    assert forward_peak_bytes(m, 100, 2) == 100 * (2 * 4096 + 3 * 14336 // 2) * 2
    moe = get_model("mixtral-8x7b")  # top-2 of 8 experts, I 14336
    assert forward_peak_bytes(moe, 10, 1) == 10 * (2 * 4096 + 2 * (3 * 14336 + 4096)) * 2


def test_sampler_rows_are_capped_by_the_tokens():
    m = get_model("llama-3.1-8b")
    assert sampler_peak_bytes(m, 100, 256) == 100 * 4096 * 2 + round(
        100 * 128256 * SAMPLER_BYTES_PER_LOGIT)
    # more sequences -> more sampler memory; a small vocabulary leaves the forward pass the peak
    assert vllm_activation_peak_bytes(m, 8192, 1024, 1) > vllm_activation_peak_bytes(m, 8192,
                                                                                     256, 1)
    assert vllm_activation_peak_bytes(get_model("llama-2-7b"), 8192, 256, 1) == \
        forward_peak_bytes(get_model("llama-2-7b"), 8192, 1)


def test_non_torch_and_kv_head_replication():
    assert vllm_non_torch_bytes(1) < vllm_non_torch_bytes(2) == vllm_non_torch_bytes(8)
    m = get_model("llama-3.1-405b")  # 8 KV heads
    assert [kv_heads_per_gpu(m, tp) for tp in (1, 2, 8, 16)] == [8, 4, 1, 1]
    b = memory_budget("llama-3.1-405b", get_gpu("h100").memory_gb, tensor_parallel=16)
    assert b.kv_block_bytes_per_gpu == 16 * 126 * 2 * 1 * 128 * 2  # one replicated head


@pytest.mark.parametrize("mib, tp, expected", [
    (81920, 2, 0.834),   # A100 80GB: 512 + 8192*1.5 + 256*2 + 256 = 13,568 MiB reserved
    (81559, 1, 0.835),   # H100: 13,440 reserved
    (46068, 1, 0.851),   # L40S: chunk 4096, graphs 32 -> 512 + 6144 + 64 + 128 = 6,848
    (183359, 8, 0.852),  # B200: 512 + 16384*1.5 + 512*2 + 1024 = 27,136
])
def test_sglang_default_mem_fraction_static(mib, tp, expected):
    assert sglang_mem_fraction_static(mib, tp) == expected


def test_sglang_reserve_is_at_least_10_gib_on_large_gpus():
    # 512 + 2048*1.5 + 8*2 + 128 = 3,728 MiB < 10 GiB on a 64 GiB GPU -> 10 GiB reserved
    assert sglang_mem_fraction_static(65536, 1, 2048, 8) == round((65536 - 10240) / 65536, 3)
    assert sglang_mem_fraction_static(40000, 1, 2048, 8) == round((40000 - 3728) / 40000, 3)


def test_sglang_accounting_is_static_pool_minus_weights():
    gb = get_gpu("a100").memory_gb
    b = memory_budget("llama-2-70b", gb, tensor_parallel=2, accounting="sglang")
    m = get_model("llama-2-70b")
    assert [t.name for t in b.terms] == ["static_pool", "weights"]
    assert b.term("static_pool") == round(0.834 * A100)
    assert b.kv_bytes_per_gpu == round(0.834 * A100) - m.total_params()
    given = memory_budget("llama-2-70b", gb, tensor_parallel=2, accounting="sglang",
                          mem_fraction_static=0.9)
    assert given.term("static_pool") == round(0.9 * A100)
    assert given.kv_blocks > b.kv_blocks


def test_accounting_arguments_are_checked_by_name():
    with pytest.raises(ValueError, match="accounting"):
        memory_budget("llama-2-7b", 80, accounting="trt")
    with pytest.raises(ValueError, match="mem_fraction_static"):
        memory_budget("llama-2-7b", 80, accounting="sglang", mem_fraction_static=1.2)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        memory_budget("llama-2-7b", 80, max_num_batched_tokens=0)
    with pytest.raises(ValueError, match="max_num_seqs"):
        memory_budget("llama-2-7b", 80, max_num_seqs=-1)
    with pytest.raises(ValueError, match="non_torch_gb"):
        memory_budget("llama-2-7b", 80, non_torch_gb=-1)
    assert memory_budget("llama-2-7b", 80, non_torch_gb=0).term("non_torch") == 0


def test_sim_memory_prints_every_term(capsys):
    assert main(["memory", "llama-2-70b", "--gpu", "a100", "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "81,920 MiB = 80.00 GiB" in out
    for name, value in (("requested", "77,309,411,328"), ("weights", "68,976,648,192"),
                        ("activations", "973,078,528"), ("non_torch", "590,558,003"),
                        ("KV cache", "6,769,126,605")):
        line = next(ln for ln in out.splitlines() if name in ln and value in ln)
        assert line
    assert "2,582 blocks of 16 tokens" in out
    assert main(["memory", "llama-2-70b", "--gpu", "a100", "--tp", "2",
                 "--accounting", "sglang"]) == 0
    assert "static_pool" in capsys.readouterr().out


H100 = 81559 * MiB  # nvidia-smi memory.total of an H100-80GB SXM


def test_llama31_70b_fp8_on_one_h100_is_the_sum_of_the_tensorrt_llm_terms():
    """The serving check's tightest rows, by hand: TensorRT-LLM gives the KV cache 0.9 of what
    is free after the weights, the engine's activations and the rest in use."""
    b = memory_budget("llama-3.1-70b", get_gpu("h100").memory_gb, weight_dtype="fp8",
                      kv_dtype="fp8", accounting="tensorrt-llm")
    m = get_model("llama-3.1-70b")  # h 8192, I 28672, 64 heads, 8 KV heads of 128, 80 layers
    weights = m.total_params()                                     # 1 byte each
    activations = 8192 * (2 * 8192 + 3 * 28672) * 2                # the MLP of 8,192 tokens
    assert activations == 1_677_721_600 == b.term("activations") * -1
    # the start-up log of docs/source/reference/memory.md: total 79.10 GiB, 70.48 available,
    # a 6,695 MiB engine and 1,134.01 MiB of execution context leave 0.97 GiB in use besides
    non_torch = -b.term("non_torch")
    assert non_torch / GiB == pytest.approx(79.10 - 70.48 - 6695 / 1024 - 1134.01 / 1024,
                                            abs=1e-9)
    free = H100 - weights - activations - non_torch
    assert [t.name for t in b.terms] == ["device", "weights", "activations", "non_torch",
                                         "held_back"]
    assert (b.term("device"), -b.term("weights")) == (H100, weights)
    assert b.kv_bytes_per_gpu == pytest.approx(0.9 * free, abs=1)  # default fraction 0.9
    per_token = 80 * 2 * 8 * 128 * 1                               # K and V, fp8
    assert b.max_kv_tokens == int(b.kv_bytes_per_gpu // per_token) == 67_253
    assert b.kv_blocks == 67_253 // 16 == 4_203
    # vLLM's accounting at 0.9 of the device leaves 1,753 blocks: 2.4 times fewer
    assert memory_budget("llama-3.1-70b", get_gpu("h100").memory_gb, weight_dtype="fp8",
                         kv_dtype="fp8").kv_blocks == 1_753
    # trtllm-bench's published runs: 0.95 of the same free memory
    given = memory_budget("llama-3.1-70b", get_gpu("h100").memory_gb, weight_dtype="fp8",
                          kv_dtype="fp8", accounting="tensorrt-llm",
                          free_gpu_memory_fraction=0.95)
    assert given.kv_bytes_per_gpu == pytest.approx(0.95 * free, abs=1)
    assert given.kv_blocks == 4_436


def test_tensorrt_llm_terms_with_tensor_parallelism_a_reserve_and_no_room():
    gb = get_gpu("a100").memory_gb
    b = memory_budget("llama-3.1-70b", gb, tensor_parallel=2, accounting="tensorrt-llm",
                      max_num_batched_tokens=4096)
    m = get_model("llama-3.1-70b")
    # NCCL's buffers on top with TP > 1 (llm-d's vLLM increment, TP 2 less TP 1)
    assert -b.term("non_torch") == trtllm_non_torch_bytes(1) + round(0.55 * GiB) - round(
        0.13 * GiB)
    assert -b.term("activations") == forward_peak_bytes(m, 4096, 2) == 4096 * (
        2 * 8192 + 3 * 28672 // 2) * 2                             # max_num_tokens 4,096
    free = A100 - m.total_params() - 4096 * (2 * 8192 + 3 * 14336) * 2 - b.term("non_torch") * -1
    assert b.kv_bytes_per_gpu == pytest.approx(0.9 * free, abs=1)
    # the caller's reserve comes off the free memory before the fraction is taken
    r = memory_budget("llama-3.1-70b", gb, tensor_parallel=2, accounting="tensorrt-llm",
                      max_num_batched_tokens=4096, overhead_gb=1.0)
    assert r.kv_bytes_per_gpu == pytest.approx(0.9 * (free - 1e9), abs=1)
    # fp16 on one A100: nothing free, nothing held back, no KV
    none = memory_budget("llama-3.1-70b", gb, accounting="tensorrt-llm")
    assert not none.fits and none.kv_blocks == 0 and none.term("held_back") == 0
    assert "TensorRT-LLM's free fraction leaves" in none.advice


def test_free_gpu_memory_fraction_is_tensorrt_llms_knob_and_below_1():
    for other in ("vllm", "sglang"):
        with pytest.raises(ValueError, match=r"^free_gpu_memory_fraction is used by "
                                             r"accounting='tensorrt-llm' only, got 0.5 with "
                                             rf"accounting='{other}'$"):
            memory_budget("llama-2-7b", 80, accounting=other, free_gpu_memory_fraction=0.5)
    for bad, msg in ((1.0, "must be below 1 .TensorRT-LLM refuses 1.0., got 1.0"),
                     (1.2, "must be at most 1"), (0, "free_gpu_memory_fraction"),
                     ("half", "free_gpu_memory_fraction")):
        with pytest.raises((ValueError, TypeError), match=msg):
            memory_budget("llama-2-7b", 80, accounting="tensorrt-llm",
                          free_gpu_memory_fraction=bad)
    with pytest.raises(ValueError, match="mem_fraction_static is used by accounting='sglang'"):
        memory_budget("llama-2-7b", 80, accounting="tensorrt-llm", mem_fraction_static=0.5)


@pytest.mark.parametrize("other", ["sglang", "tensorrt-llm"])
def test_vllms_utilization_is_refused_by_the_other_accountings_not_ignored(other):
    """gpu_memory_utilization is vLLM's: given with another accounting it changed nothing
    (its default of 0.9 could not be told from a value given); now None by default, 0.9 under
    vLLM's accounting, an error under the others, and not recorded where unused."""
    with pytest.raises(ValueError, match=rf"^gpu_memory_utilization is used by "
                                         rf"accounting='vllm' only, got 0.8 with "
                                         rf"accounting='{other}'$"):
        memory_budget("llama-2-7b", 80, accounting=other, gpu_memory_utilization=0.8)
    assert memory_budget("llama-2-7b", 80, accounting=other).gpu_memory_utilization is None
    default = memory_budget("llama-2-7b", 80)
    assert default.gpu_memory_utilization == 0.9
    assert default == memory_budget("llama-2-7b", 80, gpu_memory_utilization=0.9)


def test_sim_memory_prints_the_tensorrt_llm_terms(capsys):
    argv = ["memory", "llama-3.1-70b", "--gpu", "h100", "--weight-dtype", "fp8", "--kv-dtype",
            "fp8", "--accounting", "tensorrt-llm"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "tensorrt-llm accounting on one GPU:" in out
    for label, value in (("+ device", "85,520,809,984"), ("- weights", "70,553,706,496"),
                         ("- activations", "1,677,721,600"), ("- non_torch", "1,046,342,533"),
                         ("- held_back", "free_gpu_memory_fraction 0.9 (TensorRT-LLM's "
                                         "default)")):
        assert any(label in ln and value in ln for ln in out.splitlines()), label
    # in TensorRT-LLM's blocks of 32 tokens, the pool sim run's preset gets (review6: blocks
    # of 16 here, twice the preset's count): 4,203 of 16 then, 2,101 of 32 now
    assert "2,101 blocks of 32 tokens" in out
    trt = sim.SimConfig(scheduler="tensorrt-llm", model="llama-3.1-70b", gpu="h100",
                        weight_dtype="fp8", kv_dtype="fp8")
    assert trt.resolved_kv_blocks() == 2101
    assert main(argv + ["--free-gpu-memory-fraction", "0.95"]) == 0
    out = capsys.readouterr().out
    assert "0.95 (given)" in out and "2,218 blocks of 32 tokens" in out
    assert dataclasses.replace(trt, free_gpu_memory_fraction=0.95).resolved_kv_blocks() == 2218
    assert main(argv[:2] + ["--gpu", "a100", "--accounting", "tensorrt-llm"]) == 1  # fp16
    assert "- held_back" in capsys.readouterr().out  # a zero deduction keeps its sign


class _TensorRTLLMPolicy:
    """A policy object whose engine sizes its pool by TensorRT-LLM's accounting."""

    memory_accounting = "tensorrt-llm"

    def __init__(self, free_gpu_memory_fraction=None):
        self.free_gpu_memory_fraction = free_gpu_memory_fraction

    @staticmethod
    def engine_defaults(config):
        return {"gpu_memory_utilization": None}  # vLLM's knob: not TensorRT-LLM's

    def schedule(self, replica, now):
        pass


def test_a_policy_chooses_the_tensorrt_llm_accounting_for_the_pool():
    import sim
    gb = get_gpu("h100").memory_gb
    for f in (None, 0.95):
        cfg = sim.SimConfig(scheduler=_TensorRTLLMPolicy(f), model="llama-3.1-70b", gpu="h100",
                            weight_dtype="fp8", kv_dtype="fp8")
        want = memory_budget("llama-3.1-70b", gb, weight_dtype="fp8", kv_dtype="fp8",
                             accounting="tensorrt-llm", free_gpu_memory_fraction=f)
        assert cfg.resolved_kv_blocks() == want.kv_blocks == (4_203 if f is None else 4_436)
    cfg = sim.SimConfig(scheduler=_TensorRTLLMPolicy(), model="llama-3.1-70b", gpu="h100",
                        weight_dtype="fp8", kv_dtype="fp8", gpu_memory_utilization=0.8)
    with pytest.raises(ValueError, match="gpu_memory_utilization=0.8 is vLLM's setting.*"
                                         "tensorrt-llm's accounting"):
        cfg.resolved_kv_blocks()


@pytest.mark.parametrize("accounting, knob, value", [
    ("vllm", "gpu_memory_utilization", 0.1), ("sglang", "mem_fraction_static", 0.1),
    ("tensorrt-llm", "free_gpu_memory_fraction", 1e-9)])
def test_a_memory_fraction_that_leaves_no_room_is_named_in_the_advice(accounting, knob, value):
    """A fraction given so small that the KV cache gets nothing: the advice says it is the
    knob, with the blocks the engine's default gives (it blamed the weights: 'Even 4-bit
    weights do not fit' for an 8B model on an H100). A model too big for the GPU is not told
    about a knob it did not set."""
    b = memory_budget("llama-3.1-8b", 85.52, accounting=accounting, **{knob: value})
    default = memory_budget("llama-3.1-8b", 85.52, accounting=accounting)
    assert not b.fits and default.fits
    assert f"The {knob} given ({value:g}) is what leaves no room: the engine's default gives " \
           f"{default.kv_blocks:,} blocks." in b.advice
    assert "is what leaves no room" not in memory_budget("llama-3.1-70b", 85.52).advice
