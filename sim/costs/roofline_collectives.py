"""The roofline's collectives: the all-reduces tensor parallelism adds, priced from measured
NCCL timings or a ring model, and the custom one-/two-shot kernels that beat NCCL on small
messages.

A mixin of :class:`~sim.costs.roofline.RooflineCost`: :class:`RooflineCollectives` reads the
host's ``tp``, ``gpu`` (its NVLink bandwidth), ``gpu_key`` (the table's GPU name) and ``params``
(:class:`~sim.costs.roofline_params.RooflineParams`). A layer has two all-reduces (for a
parallel attention+MLP block ``parallel_block_allreduces``: one by default, its two outputs
summed before the reduction; two where the engine reduces each output in its row-parallel
linear, as TensorRT-LLM did for Falcon and GPT-J before 0.7.1), of ``tokens x hidden``
activations each. One costs NCCL's time, interpolated by size in Vidur's measured table
(``sim/data/profiles/vidur_all_reduce_ms.csv``; beyond its largest size, scaled linearly with
the bytes), or on a GPU and group size the table lacks a ring model (a latency plus ``2 (tp -
1) / tp`` of the bytes over the group's link bandwidth, :func:`group_link_bytes_per_s`: on a
switched fabric (NVSwitch) any group gets the GPU's whole scale-up bandwidth; on a fully
connected board (AMD's xGMI, ``sim/data/scaleup_fabric.csv``) a group of ``n`` uses only the
``n - 1`` links among it: two MI300X share one 64 GB/s link, not the board's 448 GB/s). On
NVLink, messages up to ``custom_allreduce_max_bytes`` (vLLM's 8 MiB; groups of at most 8
GPUs) take the faster of that and a custom one-/two-shot kernel
(:meth:`~RooflineCollectives.custom_allreduce_time`: a stage latency per stage plus the bytes
each GPU moves, fitted to published vLLM kernel timings) - at batch 1 an all-reduce is a few
KiB and the custom kernel costs a third of NCCL's. Its fitted rate
(``custom_allreduce_bytes_per_s``, 67 GB/s of the bytes one GPU moves) is within 5 % of one
xGMI link (64 GB/s), so on a fully connected board it needs no group term: its one-shot reads
each peer's buffer over that peer's own link.

Invariants: one GPU (``tp`` 1) has no all-reduce (0 s); the table is a lower envelope, so a
message never costs more than a measured larger one; the price depends only on the bytes, so
the host memoises it per token count.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import numpy as np


@lru_cache(maxsize=1)
def mesh_fabrics() -> dict:
    """``gpu name -> (peers, GB/s per direction of one peer link)`` of the fully connected
    (unswitched) boards in ``sim/data/scaleup_fabric.csv``."""
    import csv
    text = resources.files("sim").joinpath("data/scaleup_fabric.csv").read_text()
    out = {}
    for i, row in enumerate(csv.DictReader(r for r in text.splitlines() if not r.startswith("#"))):
        try:
            peers, gbps = int(row["peers"]), float(row["peer_unidir_gbps"])
        except (TypeError, ValueError):
            peers = gbps = 0
        if row["topology"] != "full-mesh" or peers < 1 or not gbps > 0 or "http" not in (
                row["source"] or ""):
            raise ValueError(f"scaleup_fabric.csv row {i + 1}: {row!r} needs topology "
                             f"full-mesh, peers >= 1, peer_unidir_gbps > 0 and a source URL")
        out[row["gpu"]] = (peers, gbps)
    return out


def group_link_bytes_per_s(gpu, n: int) -> float:
    """Bytes/s per direction one GPU of an ``n``-GPU group can send to the others: the GPU's
    scale-up bandwidth (``link_bandwidth_gbps``) on a switched fabric, whatever ``n``; on a fully
    connected board (:func:`mesh_fabrics`) ``n - 1`` peer links, at most that bandwidth (groups
    larger than the board are capped there too); 0 with no scale-up link."""
    link = gpu.link_bandwidth_gbps * 1e9
    mesh = mesh_fabrics().get(gpu.name)
    if mesh is None or not link:
        return link
    peers, gbps = mesh
    return min(link, min(n - 1, peers) * gbps * 1e9)


@lru_cache(maxsize=1)
def allreduce_table() -> dict:
    """``(gpu key, GPUs) -> (sizes in bytes, seconds)``: the measured NCCL all-reduces, their
    lower envelope."""
    import csv
    text = resources.files("sim").joinpath("data/profiles/vidur_all_reduce_ms.csv").read_text()
    table = {}
    for row in csv.DictReader(text.splitlines()):
        table.setdefault((row["gpu"], int(row["num_workers"])), []).append(
            (float(row["size_bytes"]), float(row["all_reduce_ms"]) * 1e-3))
    out = {}
    for k, v in table.items():
        sizes, times = np.array(sorted(v)).T
        # the lower envelope: an all-reduce never costs more than a measured larger one (it
        # could be padded to it); removes single noisy small-message medians (A100, 4 GPUs:
        # 61 us at 2 KiB against 16 us at 10 KiB)
        out[k] = (sizes, np.minimum.accumulate(times[::-1])[::-1])
    return out


class RooflineCollectives:
    """The all-reduces of :class:`~sim.costs.roofline.RooflineCost` (see the module
    docstring)."""

    def allreduce_time(self, nbytes) -> float:
        """Seconds of one all-reduce of ``nbytes`` over the tensor-parallel group: NCCL (the
        measured table, else a ring), or where the GPUs share NVLink and the message is at most
        ``custom_allreduce_max_bytes`` the faster of that and :meth:`custom_allreduce_time`
        (:meth:`allreduce_times` of the one size)."""
        return float(self.allreduce_times(np.asarray([nbytes]))[0])

    def allreduce_times(self, nbytes) -> np.ndarray:
        """:meth:`allreduce_time` of each size of the array ``nbytes``, elementwise (each size
        priced as alone: tests/test_roofline_collectives.py), in one vectorised pass: the
        layers' block of 512 token counts cost 512 scalar calls (~15 us each: 7 s of a
        540-candidate plan)."""
        nbytes = np.asarray(nbytes)
        if self.tp == 1:
            return np.zeros(len(nbytes))
        p = self.params
        table = allreduce_table().get((self.gpu_key, self.tp))
        if table is not None:
            sizes, times = table
            t = np.where(nbytes <= sizes[-1], np.interp(nbytes, sizes, times, right=None),
                         times[-1] * nbytes / sizes[-1])
        else:
            link = group_link_bytes_per_s(self.gpu, self.tp) or 32e9  # else PCIe Gen4 x16
            t = p.allreduce_latency_s + 2 * (self.tp - 1) / self.tp * nbytes / (
                link * p.allreduce_eff)
        if self.gpu.link_bandwidth_gbps and self.tp <= 8:
            t = np.where(nbytes <= p.custom_allreduce_max_bytes,
                         np.minimum(t, self.custom_allreduce_times(nbytes)), t)
        return np.asarray(t, dtype=np.float64)

    def custom_allreduce_time(self, nbytes) -> float:
        """The custom all-reduce kernels' closed form (vLLM, TensorRT-LLM, PyTorch's intra-node
        all-reduce): one-shot, every GPU reads the ``tp - 1`` other buffers and sums (one stage
        of ``custom_allreduce_latency_s``), or two-shot, a reduce-scatter then an all-gather (two
        stages, ``2 (tp - 1) / tp`` of the bytes); the cheaper of the two."""
        return float(self.custom_allreduce_times(np.asarray([nbytes]))[0])

    def custom_allreduce_times(self, nbytes) -> np.ndarray:
        """:meth:`custom_allreduce_time` of each size of the array ``nbytes``."""
        p, tp = self.params, self.tp
        t0, rate = p.custom_allreduce_latency_s, p.custom_allreduce_bytes_per_s
        return np.minimum(t0 + (tp - 1) * nbytes / rate,
                          2 * t0 + 2 * (tp - 1) / tp * nbytes / rate)
