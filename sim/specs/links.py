"""The KV-transfer link between two machines: a disaggregated run whose pools are of two GPU
types (prefill on one, decode on another) cannot share an NVLink domain, so each prefill GPU
sends its KV shard over the network.

The assumption, per GPU and per direction: one 400 Gb/s RDMA NIC (50 GB/s), as in NVIDIA's
DGX H100 (eight single-port ConnectX-7 400 Gb/s adapters for the compute fabric, one per GPU:
NVIDIA DGX H100 User Guide, "Hardware Overview", read 2026-12-02), capped by the PCIe link
between each end's GPU and its NIC (GPUDirect RDMA crosses it): half the bidirectional PCIe
figure of ``sim/data/gpus.csv``'s ``pcie`` column ("Gen4 x16 (64 GB/s bidir)": 32 GB/s), on
either side. A GPU whose row gives no PCIe figure is capped by the NIC alone. Full-duplex, no
congestion from other traffic: an upper bound on what a real fabric gives.
"""

from __future__ import annotations

import re

NIC_GBPS = 50.0  # GB/s per direction: one 400 Gb/s NIC per GPU (see the module docstring)
_PCIE = re.compile(r"\((\d+(?:\.\d+)?) GB/s bidir\)")


def pcie_gbps(gpu) -> float | None:
    """One direction of ``gpu``'s PCIe link in GB/s, from its preset row; None: not given."""
    from .gpus import gpu_row
    m = _PCIE.search(gpu_row(gpu)["pcie"])
    return float(m.group(1)) / 2 if m else None


def network_link_gbps(prefill_gpu, decode_gpu) -> float:
    """GB/s per direction of the network link from a GPU of type ``prefill_gpu`` to one of
    ``decode_gpu``: the NIC, capped by either end's PCIe (see the module docstring)."""
    caps = [c for c in (pcie_gbps(prefill_gpu), pcie_gbps(decode_gpu)) if c is not None]
    return min([NIC_GBPS] + caps)
