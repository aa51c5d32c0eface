"""Hardware and model specs: what a model is, what a GPU can do, what fits in its memory.

``models`` (``ModelConfig``, architecture presets, parameter counts), ``hf_config`` (a Hugging
Face ``config.json`` read into ``ModelConfig``'s fields), ``gpus`` (GPU
presets: peaks, bandwidth, memory), ``memory`` (``kv_cache_bytes``, ``blocks_needed``,
``memory_budget``), ``memory_terms`` (what vLLM and SGLang subtract before the KV cache, with
sources), ``quantization`` (``quantize`` / ``dequantize``), ``economics`` (sourced GPU rental
prices and the power model's terms, keyed by GPU name). Data tables are bundled in
``sim/data`` (sources in its NOTICE.md) and read-only.

May import: ``sim.checks``, ``sim.constants``. Nothing else of ``sim``.
"""
