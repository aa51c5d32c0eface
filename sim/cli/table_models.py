"""The settings of issue 31's model features: expert parallelism (:mod:`sim.costs.expert_parallel`).

Rows of the one settings table (:mod:`sim.cli.table` appends ``ROWS``); each sets the
``SimConfig`` field of its key, which checks it against the model and ``tensor_parallel``.
"""

from __future__ import annotations

from .arguments import at_least_zero, count
from .setting import Setting

ROWS = (
    Setting("expert_parallel", ("--ep",), parse=int, metavar="GPUS", check=count, default=1,
            help="expert-parallel GPUs of a MoE model, >= 1: each holds 1/ep of the experts "
                 "whole, its MoE layers add a dispatch and a combine all-to-all and wait for "
                 "the busiest GPU; must equal --tp (attention tensor-parallel over the same "
                 "GPUs), or --tp x --dp-attention, and divide the experts",
            default_help="default 1: experts tensor-parallel"),
    Setting("expert_skew", ("--expert-skew",), parse=float, metavar="S", check=at_least_zero,
            default=0.0, help="Zipf exponent of the experts' popularity under --ep, >= 0: the "
                              "hottest experts on one GPU, which the others wait for",
            default_help="default 0: uniform routing"),
)
