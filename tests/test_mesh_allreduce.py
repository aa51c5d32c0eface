"""All-reduce bandwidth on fully connected (xGMI) boards (sim/costs/roofline_collectives.py's
group_link_bytes_per_s, sim/data/scaleup_fabric.csv): a group of n MI300X uses only the n - 1
links of 64 GB/s among it, checked against the published RCCL rows of sim/data/gpu_kernels.csv
(2 and 8 GPUs) and the closed form; switched (NVSwitch) GPUs keep their whole link at any size."""

import dataclasses

import pytest

from sim.costs.roofline import RooflineCost, fitted_params
from sim.costs.roofline_collectives import allreduce_table, group_link_bytes_per_s, mesh_fabrics
from sim.specs.gpus import get_gpu


def test_mesh_group_bandwidth_is_the_links_among_the_group():
    g = get_gpu("mi300x")
    # closed form: (n - 1) x 64 GB/s per direction, the 8-GPU board's 7 x 64 = 448 GB/s at most
    assert [group_link_bytes_per_s(g, n) for n in (2, 4, 8, 16)] == [64e9, 192e9, 448e9, 448e9]
    assert group_link_bytes_per_s(g, 8) == g.link_bandwidth_gbps * 1e9  # the board's aggregate
    # MI355X: 76.5 GB/s per peer, the board 7 x 76.5 = 535.5 GB/s (the same source as gpus.csv)
    assert group_link_bytes_per_s(get_gpu("mi355x"), 2) == 76.5e9
    assert group_link_bytes_per_s(get_gpu("mi355x"), 8) == 7 * 76.5e9 == 535.5e9
    assert get_gpu("mi355x").link_bandwidth_gbps == 535.5
    assert set(mesh_fabrics()) == {"MI300X", "MI325X", "MI355X"}


@pytest.mark.parametrize("gpu", ["a100", "h100", "h200", "b200", "gb200", "h20", "l40s"])
def test_switched_or_pcie_gpus_keep_their_whole_link_at_every_group_size(gpu):
    g = get_gpu(gpu)
    for n in (2, 4, 8):
        assert group_link_bytes_per_s(g, n) == g.link_bandwidth_gbps * 1e9
        # the ring's price is the old closed form, bit for bit (PCIe: 32 GB/s)
        p = dataclasses.replace(fitted_params(gpu), custom_allreduce_max_bytes=0)
        c = RooflineCost("llama-2-70b", gpu, tensor_parallel=n, params=p)
        if (c.gpu_key, n) in allreduce_table():
            continue  # priced from Vidur's measured NCCL table, not the ring
        link = g.link_bandwidth_gbps * 1e9 or 32e9
        nbytes = 1 << 24
        assert c.allreduce_time(nbytes) == p.allreduce_latency_s + 2 * (n - 1) / n * nbytes / (
            link * p.allreduce_eff)


def _rccl_rows(load_script):
    df = load_script("experiments/fit_gpu_kernels.py").load_kernels()
    return df[(df["gpu"] == "MI300X") & (df["kind"] == "allreduce")]


def test_mi300x_ring_matches_the_published_rccl_rows_at_2_and_8_gpus(load_script):
    rows = _rccl_rows(load_script)
    assert set(rows["gpus"].astype(int)) == {2, 8}  # no published 4-GPU row found
    # RCCL's ring (the rows are rccl-tests / all_reduce_bench, not a custom kernel)
    p = dataclasses.replace(fitted_params("mi300x"), custom_allreduce_max_bytes=0)
    for r in rows.itertuples():
        c = RooflineCost("llama-2-70b", "mi300x", tensor_parallel=int(r.gpus), params=p)
        err = c.allreduce_time(r.size_bytes) / (r.measured_us * 1e-6) - 1
        assert abs(err) < (0.01 if r.gpus == 8 else 0.10), (r.gpus, r.size_bytes, err)
        if r.gpus == 2:  # the board's aggregate (448 GB/s) would be 85 % too fast
            board = p.allreduce_latency_s + r.size_bytes / (448e9 * p.allreduce_eff)
            assert board / (r.measured_us * 1e-6) - 1 < -0.8
    # 4 GPUs (closed form): 3 links, so a large message takes 7/3 of the 8-GPU bandwidth's time
    big = 1 << 32
    t = {n: RooflineCost("llama-2-70b", "mi300x", tensor_parallel=n, params=p).allreduce_time(big)
         - p.allreduce_latency_s for n in (4, 8)}
    assert t[4] / t[8] == pytest.approx((2 * 3 / 4 / 192e9) / (2 * 7 / 8 / 448e9))


def test_shipped_kernel_fit_reports_the_2_gpu_row_within_10_percent():
    import json
    from importlib import resources
    doc = json.loads(resources.files("sim").joinpath("data/gpu_kernel_fit.json").read_text())
    row = {(r["gpu"], r["kind"], r["dtype"]): r for r in doc["report"]}
    assert row["MI300X", "allreduce", "2 GPUs"]["median_ape_pct"] < 10
    assert row["MI300X", "allreduce", "8 GPUs"]["median_ape_pct"] < 1


def test_a_bad_fabric_row_is_named(monkeypatch):
    import sim.costs.roofline_collectives as rc

    class Text:
        def __init__(self, text):
            self.text = text

        def joinpath(self, *_):
            return self

        def read_text(self):
            return self.text

    bad = "gpu,topology,peers,peer_unidir_gbps,source\nMI300X,full-mesh,7,zero,https://x\n"
    monkeypatch.setattr(rc.resources, "files", lambda _: Text(bad))
    rc.mesh_fabrics.cache_clear()
    try:
        with pytest.raises(ValueError, match="scaleup_fabric.csv row 1: .*peer_unidir_gbps"):
            rc.mesh_fabrics()
    finally:
        monkeypatch.undo()
        rc.mesh_fabrics.cache_clear()
