"""Tests of sim/results/report.py and ``sim run --report``: the page is parsed; it holds the
summary values, the findings and the figures as inline PNG; it needs no network; it is written
atomically; bad report paths are one-line CLI errors."""

import base64
import html.parser
import json
import os

import numpy as np
import pandas as pd
import pytest

import sim
from sim.cli import main
from sim.results import report as report_module
from sim.results.report import render, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Page(html.parser.HTMLParser):
    """The parts of the page the tests read: images, links, findings, table rows, headings."""

    def __init__(self, text):
        super().__init__()
        self.images, self.urls, self.findings, self.rows, self.headings = [], [], [], {}, []
        self.labels, self.sections = {}, []
        self._cell, self._row, self._tag, self._finding = None, [], None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self._tag = tag
        if tag == "img":
            self.images.append(attrs["src"])
        for key in ("src", "href"):
            if key in attrs:
                self.urls.append(attrs[key])
        if tag == "div" and "data-code" in attrs:
            self._finding = [attrs["data-code"], ""]
            self.findings.append(self._finding)
        if tag in ("th", "td"):
            self._cell = ""
        if tag == "tr":
            self._row = []

    def handle_endtag(self, tag):
        self._tag = None
        if tag in ("th", "td"):
            self._row.append(self._cell)
            self._cell = None
        if tag == "tr" and len(self._row) == 2:
            self.rows.setdefault(self._row[0], self._row[1])
        if tag == "tr" and len(self._row) == 3:  # a summary row: label, value, key
            self.rows.setdefault(self._row[2], self._row[1])
            self.labels.setdefault(self._row[2], self._row[0])
        if tag == "div":
            self._finding = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        if self._finding is not None:
            self._finding[1] += data
        if self._tag in ("h1", "h2"):
            self.headings.append(data)
        if self._tag == "h3":
            self.sections.append(data)


def _overloaded():
    rng = np.random.default_rng(0)
    n = 200
    df = pd.DataFrame({"arrival_time": np.cumsum(rng.exponential(1 / 200.0, n)),
                       "num_prompt_tokens": 100, "num_output_tokens": 50})
    return sim.run(df, scheduler="continuous", cost_model=sim.LinearCost(0.005, 1e-5, 1e-4),
                   max_batch_size=8)


@pytest.fixture(scope="module")
def overloaded():
    return _overloaded()


def test_page_holds_summary_findings_and_inline_figures(overloaded):
    slo = {"ttft": 0.5}
    page = Page(render(overloaded, slo=slo))
    s = overloaded.summary(slo=slo)
    assert page.headings[:4] == ["Simulation report", "Findings", "Summary", "Figures"]
    assert page.rows["ttft_p99"] == f"{s['ttft_p99']:.4g} s"
    assert page.rows["slo_attainment"] == f"{s['slo_attainment']:.1%}"
    assert page.rows["num_requests"] == "200"
    findings = overloaded.diagnose()
    assert "overloaded" in {f.code for f in findings}
    assert [code for code, _ in page.findings] == [f.code for f in findings]
    for (_, text), f in zip(page.findings, findings):
        assert f.message in text and f.action in text
    assert len(page.images) == 3  # CDFs, timeline, Gantt (200 requests)
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == PNG_MAGIC
    assert all(u.startswith("data:") for u in page.urls)  # nothing fetched from anywhere
    assert page.rows["max_batch_size"] == "8" and page.rows["KV blocks in the pool"]


def test_text_from_the_run_is_escaped(overloaded):
    text = render(overloaded, settings={"workload": "<script>alert(1)</script>"}, figures=False)
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert "<h2>Figures</h2>" not in text and "<img" not in text
    assert Page(text).rows["workload"] == "<script>alert(1)</script>"


def test_a_healthy_run_says_it_has_no_finding_and_a_large_one_has_no_gantt(monkeypatch):
    df = pd.DataFrame({"arrival_time": np.arange(20) * 1.0, "num_prompt_tokens": 50,
                       "num_output_tokens": 10})
    res = sim.run(df, cost_model=sim.ConstantCost(0.01))
    assert res.diagnose() == []
    text = render(res)
    assert "No finding" in text and len(Page(text).images) == 3
    monkeypatch.setattr(report_module, "GANTT_MAX", 10)
    assert len(Page(render(res)).images) == 2


def test_a_run_with_nothing_to_draw_says_so_under_figures():
    """Every request rejected at arrival: the Figures heading stood alone, as if figures were
    lost; it now says why there is none."""
    df = pd.DataFrame({"arrival_time": [0.0, 1.0], "num_prompt_tokens": [200_000, 300_000],
                       "num_output_tokens": 5})
    res = sim.run(df, cost_model=sim.ConstantCost(0.01))
    page = Page(render(res))
    assert not page.images and res.summary()["num_finished"] == 0 and not len(res.iterations)
    assert "<h2>Figures</h2>\n<p>No figure: no request finished and no iteration ran" in render(res)
    one = sim.run(df.assign(num_prompt_tokens=50), cost_model=sim.ConstantCost(0.01))
    assert "No figure" not in render(one) and len(Page(render(one)).images) == 3


def test_write_is_atomic_and_leaves_nothing_behind_on_failure(overloaded, tmp_path, monkeypatch):
    path = tmp_path / "sub" / "r.html"
    assert write_report(overloaded, path, figures=False) == path  # folder created
    first = path.read_text()
    assert first.startswith("<!DOCTYPE html>") and first.rstrip().endswith("</html>")
    assert sorted(os.listdir(path.parent)) == ["r.html"]

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("sim.results.atomic.os.replace", broken_replace)  # (its writer)
    with pytest.raises(OSError, match="disk full"):
        write_report(overloaded, path, slo={"e2e": 1.0}, figures=False)
    assert path.read_text() == first  # the previous page, whole
    assert sorted(os.listdir(path.parent)) == ["r.html"]  # no temporary file left


def test_sim_run_report_flag_writes_the_page(tmp_path, capsys):
    path = tmp_path / "report.html"
    argv = ["run", "-w", "azure-code", "-n", "30", "--cost", "constant:0.01", "--no-plots",
            "--slo-ttft", "0.5", "-o", str(tmp_path / "o"), "--report", str(path)]
    assert main(argv) == 0
    assert f"wrote the report to {path}" in capsys.readouterr().out
    page = Page(path.read_text())
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())["summary"]
    assert page.rows["workload"] == "azure-code" and page.rows["slo_ttft"] == "0.5 s"
    assert page.rows["slo_attainment"] == f"{summary['slo_attainment']:.1%}"
    for key, unit in (("ttft_p99", "s"), ("request_throughput", "req/s")):
        assert page.rows[key] == f"{summary[key]:.4g} {unit}"  # the same run as the files
    assert len(page.images) == 3


def test_report_from_the_toml_file(tmp_path, capsys):
    cfg = tmp_path / "exp.toml"
    cfg.write_text(f'workload = "azure-code"\nnum_requests = 20\ncost = "constant:0.01"\n'
                   f'plots = false\noutput = "{tmp_path / "o"}"\n'
                   f'report = "{tmp_path / "r.html"}"\n')
    assert main(["run", str(cfg), "-q"]) == 0
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("bad, message", [
    ("report.txt", "--report must be a file name ending in .html, got 'report.txt'"),
    ("dir.html", "--report 'dir.html' is a folder; give a file name"),
])
def test_bad_report_paths_are_one_line_errors_before_the_run(tmp_path, capsys, bad, message,
                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir.html").mkdir()
    argv = ["run", "-w", "azure-code", "-n", "20", "--cost", "constant:0.01", "-o", "o",
            "--report", bad]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"sim run: error: {message}\n"
    assert not (tmp_path / "o").exists()  # checked before anything was simulated or written


def test_the_summary_reads_in_sections_with_labels_and_units(overloaded):
    """(issue 32, item 9) The page's summary was 57 raw snake_case keys without units and its
    settings showed None and {}: sections, a label and a unit for each metric (its key beside
    it, for scripts), a share as a percentage; an unset setting reads "not set", an empty one
    "none"."""
    page = Page(render(overloaded, slo={"ttft": 0.5, "itl": 0.1},
                       settings={"rate": None, "slo": {}, "model": "llama-3.1-8b"},
                       figures=False))
    assert {"Requests", "Latency", "SLOs", "Throughput", "Batch and KV cache",
            "Run"} <= set(page.sections)
    assert page.labels["ttft_p99"] == "TTFT P99" and page.rows["itl_p50"].endswith(" s")
    assert page.labels["slo_attainment_itl"] == "meet the ITL SLO (every gap)"
    assert page.rows["slot_utilization"].endswith("%")
    assert page.rows["output_token_throughput"].endswith(" tok/s")
    assert (page.rows["rate"], page.rows["slo"]) == ("not set", "none")
    assert "Other" not in page.sections  # every metric has its section
    assert not [label for label in page.labels.values() if "_" in label]  # and a label
