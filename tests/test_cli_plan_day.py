"""sim plan FILE.toml with a [day] table (sim.cli.plan_day): the same table as plan_day on the
day workloads.day_like makes of the file's workload, the winner's day written (its plot and its windows), no winner
exit 1, bad [day] and [space] keys one-line errors naming the file and the key."""

import re

import pandas as pd
import pytest

import sim
import workloads as wl
from sim.cli.main import main
from sim.tools.plan_day import plan_day

DAY = """model = "llama-3.1-8b"
gpu = "a100"
workload = "azure-conv"
num_requests = 1500
rate = 6.0
attainment = 0.95

[slo]
ttft = {ttft}

[day]
hours = 0.2
peak_to_trough = 3.0
period_hours = 0.2
scale_down_delay_s = 60.0
fixed = [1, 2]

[space]
target = [8.0, 16.0]
max_replicas = [3]
"""


def _plan(tmp_path, text, *extra):
    (tmp_path / "day.toml").write_text(text)
    return main(["plan", str(tmp_path / "day.toml"), "-o", str(tmp_path / "out"),
                 "--workers", "1", "--no-progress", *extra])


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    d = tmp_path_factory.mktemp("day")
    assert _plan(d, DAY.format(ttft=1.0)) == 0
    return d / "out"


def _the_day():
    trace = wl.load("azure-conv", n=1500, rate=6.0, seed=0)
    return wl.day_like(trace, 0.2, peak_to_trough=3.0, peak_hour=14.0 * 0.2 / 24,
                       period_hours=0.2, seed=0)


def test_the_table_is_plan_days_on_the_traces_day(planned):
    day = _the_day()
    policy = sim.Autoscaler(scale_down_delay_s=60.0)
    want = plan_day(day, {"ttft": 1.0}, base=sim.SimConfig(model="llama-3.1-8b", gpu="a100"),
                    space={"target": [8.0, 16.0], "max_replicas": [3]}, fixed=[1, 2],
                    policy=policy, attainment=0.95, workers=1)
    got = pd.read_csv(planned / "plan_day.csv")
    assert len(got) == 4 and list(got["kind"]) == list(want["kind"])
    for col in ("usd", "gpu_hours", "slo_attainment", "num_finished"):
        assert got[col].tolist() == pytest.approx(want[col].tolist(), rel=1e-12), col
    assert (got.loc[got["status"] == "ranked", "slo_attainment"] >= 0.95).all()


def test_the_winners_day_is_written(planned):
    over = pd.read_csv(planned / "day_over_time.csv")
    window = 0.2 * 3600 / 48
    assert over["start"].diff().dropna().tolist() == pytest.approx([window] * (len(over) - 1))
    assert (over["rate"] * window).sum() == pytest.approx(len(_the_day()))  # none left out
    table = pd.read_csv(planned / "plan_day.csv")
    assert over["paid"].max() <= table.iloc[0]["max_replicas"]  # the winner's day
    assert (planned / "day.png").stat().st_size > 0


def test_no_candidate_meeting_the_slo_exits_1_and_says_why(tmp_path, capsys):
    assert _plan(tmp_path, DAY.format(ttft=0.001)) == 1
    assert "no candidate meets the SLOs over the day" in capsys.readouterr().out
    t = pd.read_csv(tmp_path / "out" / "plan_day.csv")
    assert (t["stage"] == "slo").all() and t["reason"].str.contains("below 95.0%").all()


GOOD = DAY.format(ttft=1.0)


@pytest.mark.parametrize("edit,said", [
    (lambda t: t.replace("hours = 0.2\n", "hourz = 0.2\n"), r"day.toml: day.hourz: not a key"),
    (lambda t: t.replace("hours = 0.2\n", "hours = -1\n"),
     r"day.toml: day.hours must be a positive number, got -1"),
    (lambda t: t.replace("fixed = [1, 2]", "fixed = [0]"), r"day.fixed must be a list of fleet"),
    (lambda t: t.replace("target = [", "gpu = [\"h100\"]\ntarget = ["),
     r"day.toml: space.gpu: not an Autoscaler field"),
    (lambda t: t.replace("max_replicas = [3]", "max_replicas = []"),
     r"space.max_replicas must be a non-empty list"),
    (lambda t: t.replace("scale_down_delay_s = 60.0", "scale_down_delay_s = -5"),
     r"day.toml: day: scale_down_delay_s must be a number >= 0, got -5"),
    (lambda t: t.replace("fixed = [1, 2]\n", "").split("[space]")[0],
     r"a \[day\] plan needs candidates"),
    (lambda t: t.replace("[slo]\nttft = 1.0\n", ""), r"a plan needs an \[slo\]"),
    (lambda t: t.split("[day]")[0].replace("rate = 6.0\n", "rate = 6.0\nday = 3\n"),
     r"day.toml: day must be a table"),
    (lambda t: 'objective = "num_gpus"\n' + t,
     r"day.toml: objective 'num_gpus' does not apply to a \[day\] plan"),
])
def test_a_bad_day_file_is_one_line(tmp_path, capsys, edit, said):
    assert _plan(tmp_path, edit(GOOD)) == 2
    err = capsys.readouterr().err
    assert err.startswith("sim plan: error:") and len(err.strip().splitlines()) == 1, err
    assert re.search(said, err), err


def test_a_flag_of_a_plan_at_one_load_is_refused_too(tmp_path, capsys):
    assert _plan(tmp_path, GOOD, "--tol", "0.1") == 2
    assert "--tol 0.1 does not apply to a [day] plan" in capsys.readouterr().err


def test_a_dask_address_nothing_answers_at_is_named_as_the_flag(tmp_path):
    import dask
    (tmp_path / "day.toml").write_text(GOOD)
    import dask.distributed  # noqa: F401 (its defaults loaded first: a set() of a key dask
    # does not know yet removes the whole "distributed" section when it is undone)
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        with pytest.raises(ValueError, match=r"^--dask 'tcp://127.0.0.1:1': no Dask scheduler"):
            main(["--debug", "plan", str(tmp_path / "day.toml"), "-o", str(tmp_path / "o"),
                  "--dask", "tcp://127.0.0.1:1"])


def test_the_winner_toml_replays_the_winners_day_from_any_folder(planned, monkeypatch):
    """Newcomer review: a day plan wrote no winner.toml. It is the file with the winner as its
    only candidate (a fixed fleet's size as day.fixed, an autoscaled one's knobs as one-value
    [space] lists; sim run has no autoscaler), paths absolute: ``cd out && sim plan
    winner.toml`` ranks the winner alone with its numbers."""
    import tomllib
    with open(planned / "winner.toml", "rb") as f:
        winner = tomllib.load(f)
    assert winner["output"] == str((planned / "winner").resolve())
    best = pd.read_csv(planned / "plan_day.csv").iloc[0]
    if best["kind"] == "fixed":
        assert winner["day"]["fixed"] == [int(best["max_replicas"])] and "space" not in winner
    else:
        assert "fixed" not in winner["day"] and set(winner["space"]) == {"target", "max_replicas"}
    monkeypatch.chdir(planned)
    assert main(["plan", "winner.toml", "--workers", "1", "--no-progress"]) == 0
    again = pd.read_csv(planned / "winner" / "plan_day.csv")
    assert len(again) == 1 and again["kind"].iloc[0] == best["kind"]
    for col in ("usd", "gpu_hours", "slo_attainment", "num_finished", "max_replicas"):
        assert again[col].iloc[0] == pytest.approx(best[col], rel=1e-12), col
    assert (planned / "winner" / "winner.toml").exists()


def test_an_autoscaled_winner_replays_from_one_value_space_lists(tmp_path, monkeypatch):
    """Without the 1-replica fleet the autoscaled target 16 wins (0.72 $ against the 2-replica
    fleet's 0.76, the table above): its winner.toml's [space] holds its knobs, one value each."""
    assert _plan(tmp_path, DAY.format(ttft=1.0).replace("fixed = [1, 2]", "fixed = [2]")) == 0
    best = pd.read_csv(tmp_path / "out" / "plan_day.csv").iloc[0]
    assert best["kind"] == "autoscaled"
    text = (tmp_path / "out" / "winner.toml").read_text()
    assert "[space]\ntarget = [16.0]\nmax_replicas = [3]\n" in text and "fixed" not in text
    monkeypatch.chdir(tmp_path / "out")
    assert main(["plan", "winner.toml", "--workers", "1", "--no-progress"]) == 0
    again = pd.read_csv(tmp_path / "out" / "winner" / "plan_day.csv")
    assert len(again) == 1 and again["usd"].iloc[0] == pytest.approx(best["usd"], rel=1e-12)
