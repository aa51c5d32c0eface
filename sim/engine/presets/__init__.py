"""Engine presets: real engines' scheduling rules and defaults, rule by rule.

Modules: ``vllm`` (vLLM v1), ``sarathi`` (Sarathi-Serve), ``orca`` (Orca), ``sglang``
(SGLang's scheduler: prefill-only iterations on the decode clock), ``tensorrt_llm``
(TensorRT-LLM's capacity scheduler) and ``tensorrt_llm_chunking`` (its context-chunking
policies); ``offload`` (KV offload presets: vLLM's native CPU offload, LMCache, SGLang
HiCache, as :class:`~sim.engine.kv.tiers.KVTierChain` objects from
``sim/data/offload_presets.csv``). Each scheduling preset is a policy (the contract: ``sim.engine.core.policies``) whose
``engine_defaults`` bring its engine's defaults and whose docstring lists its rules with the
source they follow; each rule is tested (tests/test_presets.py and one test module per engine).
The table of names is ``sim.engine.schedulers``.

May import: ``sim.engine.core`` (the policy contract, the request states), ``sim.engine.kv``
(the offload settings); ``sim.checks``,
``sim.specs``, ``sim.results`` (reason names). Presets are independent of each other except
for shared helpers of ``vllm``; never the fleet or speculation.
"""
