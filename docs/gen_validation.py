"""The validation page's tables, generated at build time from the files the scripts write.

Sources (each rewritten only by its script's ``--write``, so the page shows what the last run
measured, never a number typed by hand):

- ``sim/data/serving_check.json`` - ``experiments/validate_serving.py``: whole serving runs
  against published measurements, per engine and metric;
- ``sim/data/roofline_fit.json`` - ``experiments/fit_roofline.py``: the roofline's fitted
  terms and the per-layer, attention-kernel, fixed-cost, decode, all-reduce reports;
- ``sim/data/moe_fit.json`` - ``experiments/moe_kernels.py``: the fused-MoE kernel fit;
- ``sim/data/profiles/cpu_calibration.json`` - ``sim calibrate``: the shipped CPU profile's
  held-out errors;
- ``sim/data/independent_check.json`` - ``experiments/validate_independent.py``: the
  independent set of measured serving runs, per metric, GPU and engine, fit and held-out;
- ``sim/data/engine_overheads.json`` - ``experiments/fit_overheads.py``: the engines'
  overheads fitted on that set's fit split, and the medians before and after;
- ``sim/data/ttft_tail.json`` - ``experiments/ttft_tail.py``: the TTFT P99 the replay misses,
  row by row, and the burst front-end what-if;
- ``sim/data/ttft_residual.json`` - ``experiments/ttft_residual.py``: the first token's
  unpriced time at concurrency 1 beside each sourced candidate;
- ``sim/data/front_end_path.json`` - ``experiments/front_end_path.py``: the engines' sourced
  tokenising front ends in the closed loop, before / with / with and refitted.

Errors are signed ``predicted / measured - 1``; "median |error|" is over the rows of a group,
"worst" the signed error of largest magnitude. :data:`TABLES` names every table a page can ask
for (``<!-- gen: validation.NAME -->``).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "sim" / "data"


def _load(name):
    return json.loads((DATA / name).read_text())


def _pct(x, signed=False) -> str:
    """A fraction as a percentage: ``0.0409`` -> ``4.1 %`` (``+4.1 %`` when signed)."""
    return f"{100 * x:+.1f} %" if signed else f"{100 * x:.1f} %"


def table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def grouped(rows, keys, error="error_pct", scale=0.01):
    """``rows`` grouped by ``keys`` (in first-seen order): ``(key values, count, median |error|,
    worst signed error)``, errors as fractions (``scale`` turns a percentage into one)."""
    groups = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r[error] * scale)
    return [(key, len(errs), statistics.median(abs(e) for e in errs), max(errs, key=abs))
            for key, errs in groups.items()]


# ---- the tables ---------------------------------------------------------------------------

def serving() -> str:
    rows = sorted(_load("serving_check.json")["summary"], key=lambda s: (s["engine"], s["metric"]))
    return table(["engine (published runs)", "metric", "split", "rows", "median \\|error\\|",
                  "P90 \\|error\\|", "worst"],
                 [(f"`{s['engine']}`", s["metric"], s["split"], s["rows"],
                   _pct(s["median_abs_error"]), _pct(s["p90_abs_error"]),
                   _pct(s["worst"], signed=True)) for s in rows])


def per_layer() -> str:
    fit = _load("roofline_fit.json")
    return table(["GPU", "model", "split", "op family", "points", "median \\|error\\|", "P90"],
                 [(r["gpu"], r["model"], r["split"], r["family"], f"{r['points']:,}",
                   f"{r['median_ape_pct']:.1f} %", f"{r['p90_ape_pct']:.1f} %")
                  for r in fit["report"]])


def attention() -> str:
    rows = _load("roofline_fit.json")["attention_report"]
    out = grouped(rows, ("gpu", "kernel", "dtype", "head_dim", "split"))
    return table(["GPU", "kernel", "dtype", "head dim", "split", "rows", "median \\|error\\|",
                  "worst"],
                 [(*key, n, _pct(med), _pct(worst, signed=True)) for key, n, med, worst in out])


def fixed_costs() -> str:
    """The batch-1 first tokens and static-batch throughputs that fit the fixed costs, the FP8
    efficiency and the decode attention's bandwidth, with the error before that fit."""
    rows = _load("roofline_fit.json")["latency_report"]
    now = grouped(rows, ("metric", "gpu", "split"))
    before = {key: med for key, _, med, _ in
              grouped(rows, ("metric", "gpu", "split"), error="error_before_pct")}
    return table(["metric", "GPU", "split", "rows", "median \\|error\\|", "worst",
                  "median \\|error\\| before the fit"],
                 [(*key, n, _pct(med), _pct(worst, signed=True), _pct(before[key]))
                  for key, n, med, worst in now])


def decode() -> str:
    rows = _load("roofline_fit.json")["decode_report"]
    out = grouped(rows, ("engine", "metric", "gpu", "split"))
    return table(["engine (published)", "metric", "GPU", "split", "rows", "median \\|error\\|",
                  "worst"],
                 [(f"`{key[0]}`", *key[1:], n, _pct(med), _pct(worst, signed=True))
                  for key, n, med, worst in out])


def decode_bands() -> str:
    rows = _load("roofline_fit.json")["decode_band_report"]
    return table(["batch", "split", "rows", "median \\|error\\| of the time per token", "worst"],
                 [(r["batch"], r["split"], r["points"], f"{r['median_abs_error_pct']:.1f} %",
                   f"{r['worst_error_pct']:+.1f} %") for r in rows])


def collectives_and_cpu() -> str:
    fit = _load("roofline_fit.json")
    rows = [(f"all-reduce kernel `{r['kernel']}`", r["split"], r["points"],
             f"{r['median_abs_error_pct']:.1f} %", f"{r['worst_error_pct']:+.1f} %")
            for r in fit["custom_allreduce_report"]]
    rows += [("CPU time per iteration (Vidur's vLLM overheads)", r["split"], r["points"],
              f"{r['median_ape_pct']:.1f} %", "") for r in fit["cpu_overhead_report"]]
    for r in _load("moe_fit.json")["report"]:
        rows.append((f"fused-MoE layer, {r['model']} ({r['gpu']}, {r['dtype']})", r["split"],
                     r["rows"], _pct(r["median_abs"]), _pct(r["worst"], signed=True)))
    return table(["what", "split", "rows", "median \\|error\\|", "worst"], rows)


def per_head_decode() -> str:
    p = _load("roofline_fit.json")["per_head_decode"]
    return table(["fitted term", "value", "from", "measured ratio", "predicted ratio"],
                 [("`attn_decode_reread_fraction`", p["params"]["attn_decode_reread_fraction"],
                   f"`{p['pair'][0]}` against `{p['pair'][1]}`", p["measured_ratio"],
                   p["predicted_ratio"])])


def _flat(params, prefix=""):
    for k, v in params.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def parameters() -> str:
    """The fitted roofline terms per GPU, then the terms every GPU shares."""
    fit = _load("roofline_fit.json")
    gpus = list(fit["params"])
    per_gpu = {gpu: dict(_flat(p)) for gpu, p in fit["params"].items()}
    names = list(dict.fromkeys(n for p in per_gpu.values() for n in p))
    rows = [(f"`{n}`", *(f"{per_gpu[g][n]:.4g}" if n in per_gpu[g] else "" for g in gpus))
            for n in names]
    shared = [*_flat(fit["shared"]), *_load("moe_fit.json")["shared"].items()]
    return (table(["term", *gpus], rows) + "\nShared by every GPU:\n\n"
            + table(["term", "value"], [(f"`{n}`", f"{v:.4g}") for n, v in shared]))


def calibrated_profile() -> str:
    prof = json.loads((DATA / "profiles" / "cpu_calibration.json").read_text())
    rows = [(f"op `{op}`", "held out", e["points"], f"{e['median_ape_pct']:.1f} %",
             f"{e['p90_ape_pct']:.1f} %") for op, e in prof["heldout_error"].items()]
    it = prof["iteration_error"]
    rows.append(("whole engine iterations, executed", "fit", f"{it['points']:,}",
                 f"{it['median_ape_pct']:.1f} %", f"{it['p90_ape_pct']:.1f} %"))
    gate = "passed" if prof["quality"]["passed"] else "failed"
    return (f"Device `{prof['device']}`, model `{prof['model']['name']}`, measured "
            f"{prof['date'][:10]}; quality gate {gate}.\n\n"
            + table(["what", "split", "points", "median \\|error\\|", "P90"], rows))


def independent() -> str:
    rep = _load("independent_check.json")
    by = {(r["metric"], r["split"]): r for r in rep["by_metric"]}
    metrics = sorted({m for m, _ in by}, key=lambda m: (m == "output_throughput", m))
    rows = [(m, *(f"{_pct(by[m, s]['median_abs_error'])} ({_pct(by[m, s]['median_error'], True)}"
                  f", {by[m, s]['rows']})" if (m, s) in by else "-" for s in ("fit", "held_out")))
            for m in metrics]
    out = table(["metric", "fit: median \\|error\\| (median signed, rows)", "held-out"], rows)
    for key in ("gpu", "engine"):
        g = {}
        for r in rep[f"by_{key}"]:
            g.setdefault(r[key], {})[r["split"]] = r
        out += "\n" + table([key, "fit: median \\|error\\| (rows)", "held-out"],
                            [(f"`{k}`", *(f"{_pct(v[s]['median_abs_error'])} ({v[s]['rows']})"
                                          if s in v else "-" for s in ("fit", "held_out")))
                             for k, v in g.items()])
    cov = {(c["model"], c["split"], c["metric"]): c for c in rep.get("band_coverage", [])}
    if cov:
        ms = sorted({k[2] for k in cov}, key=lambda m: (m == "all", m))
        out += "\n" + table(["90 % band holds the measurement", *(
            f"{m} {s}" for m in ("roofline", "overheads") for s in ("fit", "held_out"))],
            [(f"`{m}`" if m != "all" else "**all metrics**", *(
                f"{_pct(cov[x, s, m]['coverage'])}" if (x, s, m) in cov else "-"
                for x in ("roofline", "overheads") for s in ("fit", "held_out"))) for m in ms])
    return out


def _host_form(r) -> str:
    """A step-2b candidate's floor: per layer (ms) or per kernel launch (us)."""
    if r.get("form", "prefill_host_layer_s") == "prefill_host_layer_s":
        return f"{r['prefill_host_layer_s'] * 1e3:.2f} ms a layer"
    return f"{r['prefill_host_launch_s'] * 1e6:.0f} us a launch"


def _shift(t) -> str:
    """A fit's per-request shift in its form: flat ms, or ms a layer of the model."""
    if t.get("per_request_layer_s"):
        return f"{t['per_request_layer_s'] * 1e3:.2f} ms a layer"
    return f"{t['per_request_s'] * 1e3:.1f} ms"


def overheads() -> str:
    fit = _load("engine_overheads.json")
    terms = table(["engine", "per_request_s", "per_request_layer_s", "per_seq_s", "overlap",
                   "per_prefill_iter_s", "prefill_host_layer_s", "prefill_host_launch_s"],
                  [(f"`{e}`", f"{t['per_request_s'] * 1e3:.1f} ms",
                    f"{t.get('per_request_layer_s', 0.0) * 1e3:.2f} ms",
                    f"{t['per_seq_s'] * 1e6:.0f} us",
                    t["overlap"], f"{t.get('per_prefill_iter_s', 0.0) * 1e3:.0f} ms",
                    f"{t.get('prefill_host_layer_s', 0.0) * 1e3:.2f} ms",
                    f"{t.get('prefill_host_launch_s', 0.0) * 1e6:.0f} us")
                   for e, t in fit["engines"].items()])
    host = table(["engine", "host floor", "its shift",
                  "fit: mean of the metrics' median \\|error\\|"],
                 [(f"`{r['engine']}`", _host_form(r), _shift(r),
                   _pct(r["fit_score_all_metrics"])) for r in fit.get("prefill_host", [])])
    by = {(r["metric"], r["split"]): r for r in fit["by_metric"]}
    metrics = sorted({m for m, _ in by}, key=lambda m: (m == "output_throughput", m))
    rows = [(m, *(f"{_pct(by[m, s]['median_abs_error_before'])} -> "
                  f"{_pct(by[m, s]['median_abs_error_after'])}" for s in ("fit", "held_out")))
            for m in metrics]
    forms = table(["engine", "flat: per_request_s", "per layer: per_request_layer_s",
                   "fit TTFT P50: flat / per layer", "kept"],
                  [(f"`{f['engine']}`", f"{f['per_request_s'] * 1e3:.1f} ms",
                    f"{f['per_request_layer_s'] * 1e3:.2f} ms",
                    f"{_pct(f['fit_ttft_p50_flat'])} / {_pct(f['fit_ttft_p50_per_layer'])}",
                    f"`{f['chosen']}`") for f in fit.get("shift_forms", [])])
    split = table(["engine", "per_prefill_iter_s", "fit: mean of the metrics' median \\|error\\|"],
                  [(f"`{r['engine']}`", f"{r['per_prefill_iter_s'] * 1e3:.0f} ms",
                    _pct(r["fit_score_all_metrics"])) for r in fit.get("prefill_split", [])])
    return terms + "\n" + forms + "\n" + (host + "\n" if fit.get("prefill_host") else "") \
        + (split + "\n" if fit.get("prefill_split") else "") \
        + table(["metric", "fit: before -> after", "held-out: before -> after"], rows)


def ttft_residual() -> str:
    """The first token's unpriced time at concurrency 1 beside the sourced candidates
    (experiments/ttft_residual.py), then the two shape checks."""
    d = _load("ttft_residual.json")
    ms = lambda x: f"{x:.1f}"  # noqa: E731
    res = table(["run", "GPU", "model", "split", "prompt", "measured", "roofline", "residual",
                 "request path", "step wait", "MTP", "unexplained / layer"],
                [(r["run_id"].split(":", 1)[1], r["gpu"], r["model"],
                  r["split"].replace("_", "-"), f"{r['mean_prompt']:.0f}", ms(r["measured_ms"]),
                  ms(r["roofline_ms"]), ms(r["residual_ms"]), ms(r["request_path_ms"]),
                  ms(r["first_step_wait_ms"]), ms(r["speculative_ms"]),
                  f"{r['unexplained_per_layer_ms']:.2f}") for r in d["residuals"]])
    sl = table(["model", "GPU", "prompt", "rise (ms): measured / roofline",
                "intercept (ms): measured / roofline"],
               [(r["model"], r["gpu"], f"{r['prompt_lo']:.0f} -> {r['prompt_hi']:.0f}",
                 f"{ms(r['measured_rise_ms'])} / {ms(r['roofline_rise_ms'])}",
                 f"{ms(r['measured_intercept_ms'])} / {ms(r['roofline_intercept_ms'])}")
                for r in d["slopes"]])
    ba = table(["model", "GPU", "concurrency", "measured TTFT P50 (ms)"],
               [(r["model"], r["gpu"], f"{r['concurrency_lo']} -> {r['concurrency_hi']}",
                 f"{r['ttft_p50_lo_ms']:.1f} -> {r['ttft_p50_hi_ms']:.1f}")
                for r in d["batching"]])
    return res + "\n" + sl + "\n" + ba


def ttft_tail() -> str:
    """The TTFT P99 row by row on the warm / cold server and with the chosen burst what-if
    (experiments/ttft_tail.py), the fit rows' pattern, the grid's scores and the medians."""
    d = _load("ttft_tail.json")
    ms = lambda x: f"{x:.0f}"  # noqa: E731
    opt = lambda x: "-" if x is None else ms(x)  # noqa: E731
    rows = table(["run", "GPU", "split", "N", "blocks before", "P50: measured / warm",
                  "P99: measured", "P99: warm / cold / what-if", "P99 excess (ms)",
                  "mean: measured / warm / what-if", "max ITL: measured / warm"],
                 [(r["run_id"].split(":", 1)[1], r["gpu"], r["split"].replace("_", "-"),
                   r["concurrency"], r["blocks_before"],
                   f"{ms(r['ttft_p50_measured'])} / {ms(r['ttft_p50_warm'])}",
                   ms(r["ttft_p99_measured"]),
                   f"{ms(r['ttft_p99_warm'])} / {ms(r['ttft_p99_cold'])} / "
                   f"{ms(r['ttft_p99_what_if'])}", ms(r["excess_p99_ms"]),
                   f"{opt(r['ttft_mean_measured'])} / {opt(r['ttft_mean_warm'])} / "
                   f"{opt(r['ttft_mean_what_if'])}",
                   f"{opt(r['itl_max_measured'])} / {opt(r['itl_max_warm'])}")
                  for r in d["rows"]])
    pat = table(["GPU", "concurrency", "fit rows", "median P99 excess (ms)", "under-predicted"],
                [(r["gpu"], r["load"], r["rows"], ms(r["median_excess_p99_ms"]),
                  r["under_predicted"]) for r in d["patterns"]])
    point = (d["chosen_s"], d["chosen_stall_s"])
    sc = table(["front end s (ms / request)", "stall D (ms)",
                "fit: mean of the metrics' median \\|error\\|", "TTFT P50 fit / held-out",
                "TTFT P99 fit / held-out", "TTFT mean fit / held-out (not scored)"],
               [(f"{r['s'] * 1e3:g}", f"{r['stall'] * 1e3:g}"
                 + (" (chosen)" if (r["s"], r["stall"]) == point else ""),
                 _pct(r["fit_score_all_metrics"]),
                 f"{_pct(r['ttft_p50_fit'])} / {_pct(r['ttft_p50_held_out'])}",
                 f"{_pct(r['ttft_p99_fit'])} / {_pct(r['ttft_p99_held_out'])}",
                 f"{_pct(r['ttft_mean_fit'])} / {_pct(r['ttft_mean_held_out'])}")
                for r in d["scores"]])
    by = {(r["at"], r["metric"], r["split"]): r["median_abs_error"] for r in d["by_metric"]}
    metrics = sorted({m for _, m, _ in by}, key=lambda m: (m == "output_throughput", m))
    med = table(["metric", "fit: before -> what-if", "held-out: before -> what-if"],
                [(m + (" (not scored)" if m in ("ttft_mean", "itl_max") else ""),
                  *(f"{_pct(by['before', m, sp])} -> {_pct(by['after', m, sp])}"
                    for sp in ("fit", "held_out"))) for m in metrics])
    gpu = table(["GPU", "engine", "split", "metric", "before -> what-if"],
                [(r["gpu"], f"`{r['engine']}`", r["split"].replace("_", "-"), r["metric"],
                  f"{_pct(r['before'])} -> {_pct(r['after'])}") for r in d["per_gpu"]
                 if r["metric"].startswith("ttft")])
    return rows + "\n" + pat + "\n" + sc + "\n" + med + "\n" + gpu


def front_end_path() -> str:
    """The engines' sourced front ends in the closed loop (experiments/front_end_path.py): the
    terms refitted under the path, the fit scores, and the medians per metric and per GPU
    before, with the path and with the path and the refit."""
    d = _load("front_end_path.json")
    terms = table(["engine", "tokeniser (us / prompt token)", "shift: fitted -> refit",
                   "per_seq_s refit (us)", "per_prefill_iter_s refit (ms)",
                   "prefill_host_layer_s refit (ms)", "prefill_host_launch_s refit (us)"],
                  [(f"`{e}`", f"{d['paths'][e]['per_prompt_token_s'] * 1e6:g}",
                    f"{_shift(_load('engine_overheads.json')['engines'][e])} -> {_shift(t)}",
                    f"{t['per_seq_s'] * 1e6:.0f}",
                    f"{t['per_prefill_iter_s'] * 1e3:.0f}",
                    f"{t.get('prefill_host_layer_s', 0.0) * 1e3:.2f}",
                    f"{t.get('prefill_host_launch_s', 0.0) * 1e6:.0f}")
                   for e, t in d["refit"].items()])
    v = ("before", "path", "refit")
    score = table(["variant", "fit: mean of the metrics' median \\|error\\|"],
                  [(k + (" (best on fit)" if k == d["best_on_fit"] else ""),
                    _pct(d["fit_scores"][k])) for k in v])
    by = {(r["metric"], r["split"]): r for r in d["by_metric"]}
    metrics = sorted({m for m, _ in by}, key=lambda m: (m == "output_throughput", m))
    med = table(["metric", "fit: before / path / refit", "held-out: before / path / refit"],
                [(m, *(" / ".join(_pct(by[m, sp][k]) for k in v)
                       for sp in ("fit", "held_out"))) for m in metrics])
    gpu = table(["GPU", "engine", "split", "metric", "before / path / refit"],
                [(r["gpu"], f"`{r['engine']}`", r["split"].replace("_", "-"), r["metric"],
                  " / ".join(_pct(r[k]) for k in v)) for r in d["per_gpu"]])
    return terms + "\n" + score + "\n" + med + "\n" + gpu


def gpu_terms() -> str:
    import csv
    from sim.costs.roofline import RooflineCost
    from sim.costs.roofline_terms import KINDS, counts
    with (DATA / "gpus.csv").open() as f:
        names = [r["gpu"] for r in csv.DictReader(f)]
    rows = []
    for name in names:
        key = RooflineCost("llama-3.1-8b", name).gpu_key
        c = counts(key)
        rows.append((name, *(c[k] for k in KINDS)))
    return table(["GPU", *(f"{k} terms" for k in KINDS)], rows)


def gpu_kernels() -> str:
    """The terms fitted to each GPU's own published kernel timings (gpu_kernel_fit.json) and
    the kernels' median |error| with the assumed terms (the profiled GPUs' mean) and with them."""
    fit = _load("gpu_kernel_fit.json")
    terms = table(["GPU", "fitted terms"], [(g, ", ".join(f"`{k}` {v:g}" for k, v in p.items()))
                                           for g, p in fit["params"].items()])
    before = {(r["gpu"], r["kind"], r["dtype"], r["split"]): r for r in fit["report_assumed"]}
    rows = [(r["gpu"], r["kind"], r["dtype"], r["split"].replace("_", "-"), r["rows"],
             f"{before[r['gpu'], r['kind'], r['dtype'], r['split']]['median_ape_pct']:.1f} % -> "
             f"{r['median_ape_pct']:.1f} %") for r in fit["report"]]
    return terms + "\n" + table(["GPU", "kernel", "dtype / GPUs", "split", "rows",
                                 "median abs. error: assumed -> fitted"], rows)


TABLES = {"independent": independent, "overheads": overheads, "ttft-residual": ttft_residual,
          "ttft-tail": ttft_tail, "front-end-path": front_end_path,
          "gpu-terms": gpu_terms,
          "gpu-kernels": gpu_kernels, "serving": serving, "per-layer": per_layer,
          "attention": attention,
          "fixed-costs": fixed_costs, "decode": decode, "decode-bands": decode_bands,
          "collectives-cpu-moe": collectives_and_cpu, "per-head-decode": per_head_decode,
          "parameters": parameters, "calibrated-profile": calibrated_profile}
