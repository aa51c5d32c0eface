"""workloads.diurnal.day_like: a trace's rate as the peak of a diurnal day, its requests'
(prompt, output) pairs drawn from the trace's, deterministic for a seed."""

import numpy as np
import pandas as pd
import pytest

import workloads as wl


def _trace(n=400, rate=5.0):
    return wl.synthetic(n, rate=rate, prompt=wl.LogNormal(500, 0.8, max_tokens=4000),
                        output=wl.LogNormal(150, 0.8, max_tokens=1000), seed=7)


def test_the_day_peaks_at_the_traces_rate_and_keeps_its_pairs():
    trace = _trace()
    day = wl.day_like(trace, 2.0, peak_to_trough=3.0, peak_hour=1.0, period_hours=2.0, seed=3)
    # over one whole period the mean rate is peak x (k + 1) / 2k = 5 x 4 / 6
    mean = 5.0 * 4 / 6
    n = len(day)
    assert abs(n - mean * 7200) < 4 * np.sqrt(mean * 7200)  # Poisson: within 4 sigma
    t = day["arrival_time"].to_numpy()
    peak = ((t > 3600 - 900) & (t < 3600 + 900)).sum() / 1800
    trough = ((t < 900) | (t > 7200 - 900)).sum() / 1800
    assert peak > 2 * trough
    pairs = set(zip(trace["num_prompt_tokens"], trace["num_output_tokens"]))
    assert set(zip(day["num_prompt_tokens"], day["num_output_tokens"])) <= pairs
    again = wl.day_like(trace, 2.0, peak_to_trough=3.0, peak_hour=1.0, period_hours=2.0, seed=3)
    pd.testing.assert_frame_equal(day, again)


def test_a_peak_rate_replaces_the_traces_own():
    trace = _trace()
    kw = dict(peak_to_trough=2.0, peak_hour=0.5, period_hours=1.0, seed=0)
    slow, fast = wl.day_like(trace, 1.0, **kw), wl.day_like(trace, 1.0, peak_rate=20.0, **kw)
    assert len(fast) / len(slow) == pytest.approx(4.0, rel=0.15)


@pytest.mark.parametrize("kw,said", [
    ({"peak_rate": -1.0}, "peak_rate must be a positive number"),
    ({"peak_to_trough": 0.5}, "peak_to_trough must be >= 1"),
])
def test_bad_settings_name_the_field(kw, said):
    with pytest.raises(ValueError, match=said):
        wl.day_like(_trace(), 1.0, **kw)


def test_a_trace_without_a_rate_asks_for_one():
    same = _trace().iloc[:2].copy()  # two requests at one time, no nominal rate
    same.attrs = {}
    same["arrival_time"] = 0.0
    with pytest.raises(ValueError, match="give peak_rate"):
        wl.day_like(same, 1.0)
