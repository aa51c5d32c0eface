import dataclasses
import math

import pytest

import sim
from hypothesis import given, strategies as st

from sim import (CHUNK_SIZE, KV_BLOCK_SIZE, KV_BLOCKS_AVAILABLE, blocks_needed, get_model,
                 kv_cache_bytes, memory_budget)
from sim.specs.gpus import get_gpu


def test_constants():
    assert (CHUNK_SIZE, KV_BLOCK_SIZE, KV_BLOCKS_AVAILABLE) == (512, 16, 1800)


@given(st.integers(1, 10**6), st.integers(1, 128), st.integers(1, 64), st.integers(1, 256),
       st.sampled_from([2, 1, 0.5, 4]))
def test_kv_cache_bytes_formula(n, layers, heads, d, dtype):
    assert kv_cache_bytes(n, layers, heads, d, dtype) == 2 * n * layers * heads * d * dtype


def test_kv_cache_bytes_matches_reference_table():
    # models.csv: kv_cache_bytes_per_token_fp16 (an independent computation)
    for name, expected in [("llama-2-7b", 524288), ("llama-3.1-70b", 327680),
                           ("qwen2.5-7b", 57344), ("tinyllama-1.1b", 22528)]:
        m = get_model(name)
        assert kv_cache_bytes(1, m.num_hidden_layers, m.num_key_value_heads, m.head_dim) == expected


@pytest.mark.parametrize("arg", ["N", "n_layers", "n_heads_kv", "d_head"])
@pytest.mark.parametrize("bad", [0, -3])
def test_kv_cache_bytes_rejects_non_positive_naming_argument(arg, bad):
    if arg == "N" and bad == 0:  # 0 tokens hold 0 bytes (issue 14: as blocks_needed(0) == 0)
        assert kv_cache_bytes(0, 2, 2, 8) == 0
        return
    kwargs = dict(N=10, n_layers=2, n_heads_kv=2, d_head=8)
    kwargs[arg] = bad
    with pytest.raises(ValueError, match=arg):
        kv_cache_bytes(**kwargs)
    with pytest.raises(ValueError, match="dtype"):
        kv_cache_bytes(1, 1, 1, 1, dtype=0)


@given(st.integers(0, 10**7), st.integers(1, 4096))
def test_blocks_needed_is_ceil(tokens, bs):
    assert blocks_needed(tokens, bs) == math.ceil(tokens / bs)
    assert blocks_needed(tokens) == -(-tokens // 16)


def test_blocks_needed_bad_input():
    with pytest.raises(ValueError, match="tokens"):
        blocks_needed(-1)
    with pytest.raises(ValueError, match="block_size"):
        blocks_needed(3, 0)


def test_memory_budget_fits_and_its_numbers():
    b = memory_budget("llama-3.1-8b", 80)
    m = get_model("llama-3.1-8b")
    assert b.fits
    assert b.weights_bytes == m.total_params() * 2
    assert b.kv_bytes_per_token == 131072
    assert b.kv_budget_bytes == pytest.approx(80e9 * 0.9 - b.weights_bytes
                                              + b.term("activations") + b.term("non_torch"))
    assert b.max_kv_tokens == int(b.kv_budget_bytes // 131072)
    assert b.kv_blocks == b.max_kv_tokens // 16
    assert b.max_batch_size(4096) == b.kv_blocks // 256
    assert b.max_batch_size(1) == b.kv_blocks
    assert "fits" in b.advice


def test_memory_budget_70b_on_one_80gb_gpu_advises_quantization_and_tp():
    h100 = get_gpu("h100").memory_gb  # 81,559 MiB as the device reports it
    b = memory_budget("llama-3.1-70b", h100)
    assert not b.fits and b.kv_blocks == 0
    assert "quantize the weights to 8 bits" in b.advice.lower()
    assert "2 GPUs with tensor parallelism" in b.advice
    assert "short by" in b.advice
    # following the advice works
    assert memory_budget("llama-3.1-70b", h100, weight_dtype="int8").fits
    assert memory_budget("llama-3.1-70b", h100, tensor_parallel=2).fits


def test_memory_budget_advises_4_bits_when_8_do_not_fit():
    b = memory_budget("llama-3.1-70b", 48)  # 70.6 GB at int8 > 43.2 usable; int4 = 35 GB fits
    assert "quantize the weights to 4 bits" in b.advice.lower()
    assert "4 GPUs" in b.advice


def test_memory_budget_405b_says_even_4_bits_do_not_fit():
    b = memory_budget("llama-3.1-405b", 80)
    assert "even 4-bit" in b.advice.lower()
    assert "8 GPUs" in b.advice or "16 GPUs" in b.advice


def test_quantized_kv_doubles_tokens():
    a = memory_budget("llama-2-7b", 40)
    b = memory_budget("llama-2-7b", 40, kv_dtype="fp8")
    assert b.kv_bytes_per_token == a.kv_bytes_per_token / 2
    assert b.max_kv_tokens == pytest.approx(2 * a.max_kv_tokens, abs=1)


def test_memory_budget_bad_values():
    with pytest.raises(ValueError, match="gpu_memory_gb"):
        memory_budget("llama-2-7b", 0)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        memory_budget("llama-2-7b", 80, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="weight_dtype"):
        memory_budget("llama-2-7b", 80, weight_dtype="fp3")
    with pytest.raises(ValueError, match="tensor_parallel"):
        memory_budget("llama-2-7b", 80, tensor_parallel=0)
    # one engine's knob under the other's accounting changed nothing, silently
    with pytest.raises(ValueError, match=r"^mem_fraction_static is used by "
                                         r"accounting='sglang' only, got 0.5 with "
                                         r"accounting='vllm'$"):
        memory_budget("llama-2-7b", 80, mem_fraction_static=0.5)
    with pytest.raises(ValueError, match=r"^non_torch_gb is used by accounting='vllm' only"):
        memory_budget("llama-2-7b", 80, accounting="sglang", non_torch_gb=1.0)


@pytest.mark.parametrize("model, tp, ok", [
    ("llama-3.1-8b", 3, False), ("llama-3.1-8b", 6, False), ("llama-3.1-8b", 4, True),
    ("llama-3.1-8b", 16, True), ("llama-3.1-8b", 32, True), ("llama-2-7b", 4, True),
    ("llama-2-7b", 5, False)])
def test_memory_budget_refuses_a_split_the_heads_do_not_allow(model, tp, ok):
    """The roofline's rule, in the budget too: TP must divide the KV heads or be a multiple of
    them (Llama-3.1-8B's 8 over 3 GPUs was budgeted as 2 heads each, while ``sim run --tp 3``
    refused it); its one KV head per GPU is replicated over 16 or 32 GPUs."""
    if ok:
        assert memory_budget(model, 80, tensor_parallel=tp).tensor_parallel == tp
    else:
        heads = get_model(model)
        match = (f"^tensor_parallel {tp} must divide or be a multiple of num_key_value_heads "
                 f"{heads.num_key_value_heads}$")
        with pytest.raises(ValueError, match=match):
            memory_budget(model, 80, tensor_parallel=tp)


@pytest.mark.parametrize("tp", [64, 1024, 3 * 32])
def test_tensor_parallel_is_bounded_by_the_attention_heads(tp, capsys):
    """(issue 32, item 6) --tp 64 and --tp 1024 on Llama-3.1-8B's 32 query heads ran and
    looked faster (a multiple of its 8 KV heads was all the check asked) and sim memory said
    they fit: TP must divide the attention heads, in SimConfig, the budget and sim memory."""
    from sim.cli import main
    with pytest.raises(ValueError, match=f"^tensor_parallel {tp} must divide "
                                         f"num_attention_heads 32 of model 'llama-3.1-8b'"):
        sim.SimConfig(tensor_parallel=tp)
    with pytest.raises(ValueError, match="num_attention_heads 32"):
        memory_budget("llama-3.1-8b", 80, tensor_parallel=tp)
    assert main(["memory", "llama-3.1-8b", "--tp", str(tp)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--tp {tp} must divide num_attention_heads 32" in err


def test_mla_kv_bytes_per_token_is_the_latent():
    """DeepSeek-V3 caches one latent of kv_lora_rank + qk_rope_head_dim = 512 + 64 values per
    token and layer (no separate K and V): 61 x 576 x 2 B = 70,272 B in bf16, against
    Llama-3.1-70B's 2 x 80 x 8 x 128 x 2 B = 327,680 B (4.7x more), and against the 128 heads
    of 192 + 128 values an MHA of the same shape would cache (71x more)."""
    ds, llama = get_model("deepseek-v3"), get_model("llama-3.1-70b")
    assert kv_cache_bytes(1, model=ds) == 61 * (512 + 64) * 2 == 70_272
    assert kv_cache_bytes(1, model=llama) == 327_680
    assert kv_cache_bytes(1, model="deepseek-v3", dtype="fp8") == 35_136
    mha = 61 * 128 * (192 + 128) * 2
    assert mha / kv_cache_bytes(1, model=ds) > 70
    # the latent is whole on every GPU of a tensor-parallel group; GQA heads are sharded
    assert kv_cache_bytes(1000, model=ds, tensor_parallel=8) == 1000 * 70_272
    assert kv_cache_bytes(1, model=llama, tensor_parallel=8) == 327_680 // 8


def test_memory_budget_of_an_mla_model():
    h200 = get_gpu("h200").memory_gb
    b = memory_budget("deepseek-v3", h200, tensor_parallel=8, weight_dtype="fp8")
    assert b.fits
    assert b.kv_bytes_per_token == 70_272
    assert b.kv_block_bytes_per_gpu == 16 * 70_272  # every GPU holds the whole latent
    assert b.max_kv_tokens == b.kv_bytes_per_gpu // 70_272
    assert b.weights_bytes == pytest.approx(get_model("deepseek-v3").total_params(), abs=8)


def test_kv_cache_bytes_from_a_model_equals_the_formula_for_gqa():
    for name in ("llama-2-7b", "llama-3.1-405b", "qwen2.5-7b", "falcon-7b", "gpt-j-6b",
                 "qwen3-30b-a3b"):
        m = get_model(name)
        for tp in (1, 2, 8, 16):
            heads = max(1, m.num_key_value_heads // tp)
            assert kv_cache_bytes(7, model=m, dtype="fp8", tensor_parallel=tp) == \
                kv_cache_bytes(7, m.num_hidden_layers, heads, m.head_dim, "fp8")
    assert kv_cache_bytes(1, model="falcon-7b") == 2 * 32 * 1 * 64 * 2  # multi-query: 8 KiB


def test_kv_cache_bytes_model_form_errors():
    with pytest.raises(ValueError, match="not both"):
        kv_cache_bytes(1, 2, model="llama-2-7b")
    with pytest.raises(ValueError, match="n_heads_kv is required"):
        kv_cache_bytes(1, 2)
    with pytest.raises(ValueError, match="tensor_parallel"):
        kv_cache_bytes(1, model="llama-2-7b", tensor_parallel=0)


def test_forward_peak_of_non_gated_parallel_and_mla_layers():
    from sim.specs.memory_terms import forward_peak_bytes
    j = get_model("gpt-j-6b")  # fc1 4h + activation 4h, attention output h held (parallel)
    assert forward_peak_bytes(j, 10, 1) == 10 * (2 * 4096 + 2 * 16384 + 4096) * 2
    opt = dataclasses.replace(j, parallel_attn=False, norms_per_layer=2)
    assert forward_peak_bytes(opt, 10, 1) == 10 * (2 * 4096 + 2 * 16384) * 2
    ds = get_model("deepseek-v3")  # MoE layer: 8 routed + 1 shared expert; dense layers smaller
    moe = 2 * 7168 + 8 * (3 * 2048 + 7168) + 3 * 2048
    attention = (2 * 7168 + 1536 + 576 + 2 * 128 * 192 + 128 * (128 + 128) + 128 * 128)
    assert moe > attention and moe > 2 * 7168 + 3 * 18432
    assert forward_peak_bytes(ds, 10, 1) == 10 * moe * 2
    assert forward_peak_bytes(ds, 10, 16) == 10 * 2 * max(
        2 * 7168 + 8 * (3 * 128 + 7168) + 3 * 128,
        2 * 7168 + 1536 + 576 + 2 * 8 * 192 + 8 * 256 + 8 * 128)


def test_zero_tokens_hold_zero_bytes_like_zero_blocks():
    from sim import blocks_needed, kv_cache_bytes
    assert kv_cache_bytes(0, model="llama-3.1-8b") == 0 and blocks_needed(0) == 0


def test_advice_counts_sequences_in_words():
    """'room for 1 sequence' (review6: '1 sequences'), and N sequences: the blocks over a
    sequence's blocks."""
    gb = get_gpu("h100").memory_gb
    one = memory_budget("llama-3.1-70b", gb, tensor_parallel=2, accounting="sglang",
                        block_size=1)
    assert one.kv_blocks // 4096 == 1 and "room for 1 sequence of 4,096 tokens." in one.advice
    many = memory_budget("llama-3.1-8b", gb)
    assert f"room for {many.kv_blocks // 256:,} sequences of 4,096" in many.advice


def test_a_block_too_big_for_the_kv_cache_names_block_size(tmp_path, capsys):
    """(issue 32, item 8) --block-size 1000000 blamed the weights ("even 4-bit weights do not
    fit"): the weights fit and leave 453,496 tokens of KV; one block of a million does not."""
    from sim.cli import main
    b = memory_budget("llama-3.1-8b", get_gpu("h100").memory_gb, block_size=1_000_000)
    assert not b.fits and b.max_kv_tokens > 0
    assert b.advice.startswith("block_size=1,000,000 does not fit: one KV block of 1,000,000 "
                               "tokens needs 122.07 GiB per GPU")
    assert "weights" not in b.advice
    with pytest.raises(ValueError, match="^block_size=1,000,000 does not fit"):
        sim.SimConfig(block_size=1_000_000).resolved_kv_blocks()
    assert main(["run", "-n", "5", "--block-size", "1000000", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sim run: error: --block-size 1,000,000 does not fit") and \
        "4-bit" not in err


def test_a_pool_larger_than_the_memory_budget_is_kept_with_a_warning():
    import warnings

    import workloads
    df = workloads.synthetic(5, rate=1.0, prompt=100, output=10, seed=0)
    fits = sim.SimConfig().resolved_kv_blocks()  # Llama-3.1-8B on an H100: 28,343 blocks
    with pytest.warns(UserWarning, match=rf"kv_tokens=16,000,000 is a pool of 1,000,000 KV "
                                         rf"blocks, more than the {fits:,} the memory budget"):
        assert sim.run(df, kv_tokens=16_000_000).kv_blocks == 1_000_000
    with pytest.warns(UserWarning, match=rf"kv_blocks={fits + 1:,} is a pool"):
        sim.run(df, kv_blocks=fits + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sim.run(df, kv_blocks=fits)  # what fits, and a cost model's own pool, say nothing
        sim.run(df, kv_blocks=10**6, cost_model=sim.ConstantCost(0.01))


def test_sim_run_says_it_once_in_the_flags_words(tmp_path, capsys):
    from sim.cli.main import main
    assert main(["run", "-w", "azure-code", "-n", "5", "--kv-tokens", "16000000", "-q",
                 "-o", str(tmp_path)]) == 0
    assert capsys.readouterr().err.strip() == (
        "sim run: warning: --kv-tokens 16,000,000 is a pool of 1,000,000 KV blocks, more than "
        "the 28,343 the memory budget leaves for them: the run keeps it, a KV cache larger "
        "than the GPU memory (sim memory shows the budget)")
