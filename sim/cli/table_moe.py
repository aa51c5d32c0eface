"""The settings of data-parallel attention under expert parallelism
(:mod:`sim.costs.dp_attention`) and of a MoE checkpoint's own expert precision.

Rows of the one settings table (:mod:`sim.cli.table` appends ``ROWS``); each sets the
``SimConfig`` field of its key, which checks it against the model, ``--tp`` and ``--ep``.
"""

from __future__ import annotations

from ..engine.config import WEIGHT_DTYPES
from .arguments import count, name_any_case
from .setting import Setting

ROWS = (
    Setting("attention_dp", ("--dp-attention",), parse=int, metavar="RANKS", check=count,
            default=1, help="data-parallel attention ranks of a MoE model under --ep, >= 1 "
                            "(SGLang's --dp with --enable-dp-attention, vLLM's "
                            "--data-parallel-size with --enable-expert-parallel): each rank of "
                            "--tp GPUs holds the attention weights and its own requests' KV, "
                            "the experts spread over all --ep = --tp x RANKS GPUs; the replica "
                            "is --ep GPUs and its pool all ranks' blocks; --max-batch-size is "
                            "the whole group's",
            default_help="default 1: attention tensor-parallel over the --ep GPUs"),
    Setting("expert_weight_dtype", ("--expert-dtype",), parse=str.lower,
            choices=WEIGHT_DTYPES + ("checkpoint",), check=name_any_case, default=None,
            help="the routed experts' own weight precision, any case: their bytes in the "
                 "memory budget and the weight reads, their GEMMs' peak; 'checkpoint': the "
                 "model's (gpt-oss: mxfp4, its attention and embeddings at --weight-dtype)",
            default_help="default: --weight-dtype"),
)
