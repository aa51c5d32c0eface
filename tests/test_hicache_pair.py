"""The SGLang HiCache pair of experiments/offload_tiers.py (``hicache_pair``): the LMSYS
HiCache post's community anchors (sim/data/offload_anchors.csv) and where the tier hits come
from as the host (L2) pool shrinks to the GPU pool's size (sim/engine/kv/radix_tiers.py)."""

import pytest


def _anchor(name):
    import csv
    from importlib import resources
    rows = csv.DictReader(resources.files("sim").joinpath(
        "data/offload_anchors.csv").read_text().splitlines())
    return next(r for r in rows if r["anchor"] == name)


def _experiment():
    from importlib import util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "experiments" / "offload_tiers.py"
    spec = util.spec_from_file_location("offload_tiers", path)
    exp = util.module_from_spec(spec)
    spec.loader.exec_module(exp)
    return exp


@pytest.fixture(scope="module")
def hicache_pair():
    return _experiment().hicache_pair()


def test_hicache_novita_hit_rates(hicache_pair):
    """The LMSYS HiCache post's community pair (sim/data/offload_anchors.csv), replayed on
    SGLang's scheduler and radix cache: the pool (192,000 tokens) is sized to its 40 % hit rate
    without HiCache (0.386); with it, the 80 % that 8-turn contexts allow
    (their prefix over their prompt: 28 / 36 of the tokens at most) within 25 %."""
    assert hicache_pair["hit_rate_off"] == pytest.approx(0.40, abs=0.02)  # (the calibration)
    published = float(_anchor("hicache_novita_hit_rate")["published_low"])
    assert hicache_pair["hit_rate_on"] == pytest.approx(published, rel=0.25)  # 0.79
    assert hicache_pair["ttft_ratio"] < 1 < hicache_pair["throughput_ratio"]


@pytest.mark.xfail(strict=True, reason="not reproduced (offload_anchors.csv): the replay's "
                                       "TTFT gain is larger than Novita's, 0.25 vs 0.44 "
                                       "(SGLang, radix cache)")
def test_hicache_novita_ttft_ratio(hicache_pair):
    published = float(_anchor("hicache_novita_ttft")["published_low"])
    assert hicache_pair["ttft_ratio"] == pytest.approx(published, rel=0.25)


@pytest.fixture(scope="module")
def hicache_small_l2():
    return _experiment().hicache_pair(ratio=1.25)


def test_hicache_gain_shrinks_when_hits_come_from_3fs(hicache_small_l2, hicache_pair):
    """With HiCache's default host pool (twice the GPU's) the L2 holds the sessions and the
    hits load at PCIe speed; an L2 of 1.25 times the GPU pool holds mostly copies of the
    GPU's own nodes (``evict_host`` evicts only host copies of device-evicted nodes), so
    almost half the hits load from 3FS (1.8 GB/s per GPU): the same hit rate, a smaller TTFT
    gain (measured 0.37 against 0.25; SGLang, radix cache)."""
    small = hicache_small_l2
    assert small["hit_rate_on"] == pytest.approx(hicache_pair["hit_rate_on"], abs=0.01)
    assert small["ttft_ratio"] > 1.3 * hicache_pair["ttft_ratio"]


def test_hicache_hits_split_between_l2_and_l3_by_the_l2_size(hicache_small_l2, hicache_pair):
    """Where the tier hits come from (the regression an L2 that grew past its capacity hid):
    at ratio 2 the L2 serves almost all of them, at 1.25 (an L2 of mostly the GPU's own
    copies) L3 serves 46 % of them (0.17 of the prompt tokens against the L2's 0.20)."""
    big, small = hicache_pair, hicache_small_l2
    assert big["l2_hit_rate"] > 0.95 * (big["l2_hit_rate"] + big["l3_hit_rate"])
    both = small["l2_hit_rate"] + small["l3_hit_rate"]
    assert small["l3_hit_rate"] > 0.35 * both and small["l2_hit_rate"] > 0.35 * both


def test_an_l2_the_gpu_pools_size_has_no_room_to_prefetch_l3_into():
    """At ratio 1 the L2 is all but copies of the GPU's nodes: SGLang's
    ``prefetch_from_storage`` finds no host memory for a prompt's rest (``evict_host`` frees
    only copies of nodes the GPU evicted) and prefetches nothing, so L3 serves almost none
    of the prompt tokens (0.1 %; 36.5 % when the prefetch ignored the L2's room) and the hit
    rate is about the run's without HiCache (0.41 against 0.39; SGLang itself refuses a
    host pool not larger than the device's, memory_pool_host.py)."""
    one = _experiment().hicache_pair(ratio=1)
    assert one["l3_hit_rate"] < 0.01
    assert one["hit_rate_on"] == pytest.approx(one["hit_rate_off"], abs=0.05)
