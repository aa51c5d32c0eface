"""The kernel launches of one eager prefill forward of a model: what the host does per
iteration holding prefill work when that forward is not replayed from a CUDA graph
(:class:`~sim.costs.overheads.EngineOverheads`' ``prefill_host_launch_s`` prices each).

Counts per layer component, read from SGLang's model files (``sim/data/prefill_launches.csv``,
its header names the files, the setting counted and the known differences); a model's count
is their sum over its layers, from its structure:

- every layer: ``norms_per_layer`` norms; two TP all-reduces when ``tensor_parallel`` > 1;
- its attention, by the layer's kind (:mod:`sim.specs.layers`: full, sliding, chunked or
  linear; a full layer of an MLA model is ``mla_attention``), plus ``output_gate`` where the
  model gates the attention output (``attn_output_gate``);
- its MLP: ``dense_mlp`` on a dense model's layers and a MoE model's dense ones
  (:attr:`~sim.specs.models.ModelConfig.num_dense_layers`), ``moe`` (and ``shared_expert``
  where ``n_shared_experts`` > 0) on its MoE layers;
- fp8 weights (``weight_dtype="fp8"``): one activation-quantisation kernel before each of a
  layer's GEMMs (the components' ``gemms``; the MoE's grouped GEMMs quantise inside ``moe``);
- once per forward: ``outside_layers`` (embedding, final norm, logits).

Invariants: the count is a positive int; it grows with every layer and never depends on the
prompt (a launch costs the host the same whatever the tokens: the GPU's work is the
roofline's); a model of the same layers counts the same in any order of them.
"""

from __future__ import annotations

import csv
from functools import lru_cache
from importlib import resources

from . import layers as kinds

_ATTENTION = {kinds.FULL: "full_attention", kinds.SLIDING: "sliding_attention",
              kinds.CHUNKED: "chunked_attention", kinds.LINEAR: "linear_attention"}


@lru_cache(maxsize=1)
def components() -> dict:
    """``{component: (launches, gemms)}`` of ``sim/data/prefill_launches.csv``."""
    text = resources.files("sim").joinpath("data/prefill_launches.csv").read_text()
    rows = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))
    return {r["component"]: (int(r["launches"]), int(r["gemms"])) for r in rows}


def _layer(kernels, fp8: bool, *names) -> int:
    """One occurrence of the components ``names`` (with fp8's quantisation kernels)."""
    return sum(kernels[n][0] + (kernels[n][1] if fp8 else 0) for n in names)


def prefill_launches(model, tensor_parallel: int = 1, weight_dtype: str = "bf16") -> int:
    """Kernel launches of one eager prefill forward of ``model`` (a ``ModelConfig``) on
    ``tensor_parallel`` GPUs with ``weight_dtype`` weights (see the module docstring)."""
    if isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int) \
            or tensor_parallel < 1:
        raise ValueError(f"tensor_parallel must be an int >= 1, got {tensor_parallel!r}")
    k, fp8 = components(), weight_dtype == "fp8"
    counts = model.layer_counts() if model.has_local_layers else {
        kinds.FULL: model.num_hidden_layers}
    n = model.num_hidden_layers * (model.norms_per_layer * k["norm"][0]
                                   + (k["tp_allreduce"][0] if tensor_parallel > 1 else 0))
    for kind, layers in counts.items():
        name = "mla_attention" if kind == kinds.FULL and model.is_mla else _ATTENTION[kind]
        gate = ("output_gate",) if model.attn_output_gate and kind != kinds.LINEAR else ()
        n += layers * _layer(k, fp8, name, *gate)
    if model.is_moe:
        moe = ("moe", "shared_expert") if model.n_shared_experts else ("moe",)
        n += model.num_moe_layers * _layer(k, fp8, *moe)
        n += model.num_dense_layers * _layer(k, fp8, "dense_mlp")
    else:
        n += model.num_hidden_layers * _layer(k, fp8, "dense_mlp")
    return n + k["outside_layers"][0]
