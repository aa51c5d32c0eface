"""``--replicas`` / ``--router`` and their TOML keys: a cluster run from the command line, a
sweep over replica counts, and the one-line errors (with a did-you-mean for router names)."""

import json

import pandas as pd
import pytest

from sim.cli import main

RUN = ["run", "-w", "azure-code", "-n", "200", "--rate", "8", "--cost", "constant:0.01",
       "--no-plots"]


def test_run_with_replicas_writes_the_replica_columns(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(RUN + ["--replicas", "3", "--router", "least_outstanding", "--tp", "2",
                       "--slo-ttft", "1", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "3 replicas, 6 GPUs in all" in text and "per GPU" in text
    doc = json.loads((out / "summary.json").read_text())
    assert doc["settings"]["replicas"] == 3 and doc["settings"]["router"] == "least_outstanding"
    assert doc["summary"]["num_gpus"] == 6
    assert doc["summary"]["goodput_per_gpu"] == pytest.approx(doc["summary"]["goodput"] / 6)
    req = pd.read_parquet(out / "requests.parquet")
    assert sorted(req["replica"].unique()) == [0, 1, 2]
    assert set(pd.read_parquet(out / "iterations.parquet")["replica"]) == {0, 1, 2}


def test_toml_keys_and_a_sweep_over_replicas(tmp_path, capsys):
    cfg = tmp_path / "cluster.toml"
    cfg.write_text('workload = "azure-code"\nnum_requests = 200\nrate = 20.0\n'
                   'cost = "constant:0.01"\nrouter = "random"\n'
                   f'output = "{tmp_path / "o"}"\nmetrics = ["ttft_p99"]\n'
                   '[grid]\nreplicas = [1, 2, 4]\n')
    assert main(["sweep", str(cfg), "--workers", "1"]) == 0
    table = pd.read_csv(tmp_path / "o" / "sweep.csv")
    assert table["replicas"].tolist() == [1, 2, 4] and (table["error"].isna()).all()
    assert table["num_gpus"].tolist() == [1, 2, 4]
    assert table["ttft_p99"].iloc[0] > table["ttft_p99"].iloc[2]
    run_cfg = tmp_path / "run.toml"
    run_cfg.write_text('workload = "azure-code"\nnum_requests = 50\ncost = "constant:0.01"\n'
                       'plots = false\nreplicas = 2\nrouter = "least_kv"\n')
    assert main(["run", str(run_cfg), "-o", str(tmp_path / "r"), "-q"]) == 0
    doc = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert doc["summary"]["num_replicas"] == 2 and doc["settings"]["router"] == "least_kv"


def test_run_disaggregated_from_flags_and_toml(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(RUN + ["--prefill-replicas", "1", "--decode-replicas", "2", "--link-bandwidth",
                       "5", "--link-latency", "0.001", "-o", str(out)]) == 0
    assert "KV transfer" in capsys.readouterr().out
    doc = json.loads((out / "summary.json").read_text())
    assert doc["summary"]["num_replicas"] == 3 and doc["summary"]["kv_transfer_time_p50"] > 0.001
    req = pd.read_parquet(out / "requests.parquet")
    assert set(req["prefill_replica"]) == {0} and set(req["replica"]) <= {0, 1, 2}
    cfg = tmp_path / "pd.toml"
    cfg.write_text('workload = "azure-code"\nnum_requests = 50\ncost = "constant:0.01"\n'
                   'plots = false\nprefill_replicas = 2\ndecode_replicas = 1\n'
                   'link_bandwidth_gbps = 50.0\n')
    assert main(["run", str(cfg), "-o", str(tmp_path / "r"), "-q"]) == 0
    doc = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert doc["summary"]["num_gpus"] == 3


@pytest.mark.parametrize("extra, message", [
    (["--link-bandwidth", "5"], "--link-bandwidth applies to disaggregation only: give "
                                "--prefill-replicas"),
    (["--replicas", "2", "--decode-replicas", "2"], "--replicas and --decode-replicas exclude "
                                                    "each other"),
    (["--prefill-replicas", "0"], "--prefill-replicas must be > 0, got 0"),
    (["--decode-replicas", "1", "--link-latency", "-1"], "--link-latency must be a finite "
                                                         "number >= 0"),
    (["--router", "round-robin"], "--router 'round-robin' is not a router (did you mean "
                                  "'round_robin'?)"),
    (["--router", "fastest"], "--router 'fastest' is not a router; known: round_robin"),
    (["--replicas", "0"], "--replicas must be > 0, got 0"),
    (["--replicas", "two"], "argument --replicas: invalid int value: 'two'"),
])
def test_bad_cluster_flags_are_one_line_errors(extra, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        rc = main(RUN + extra)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "sim-out").exists()


def test_a_toml_router_that_is_not_a_string_names_the_file(tmp_path, capsys):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('workload = "azure-code"\nnum_requests = 5\nrouter = 3\n')
    assert main(["run", str(cfg), "-o", str(tmp_path / "o")]) == 2
    assert "bad.toml: router must be a router name" in capsys.readouterr().err
