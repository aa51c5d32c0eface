"""One script for every GPU check: CuPy kernels vs NumPy, calibration, validation.

    python experiments/gpu_check.py --output gpu-results/            # on an NVIDIA GPU, < 5 min
    python experiments/gpu_check.py --device cpu --budget 10 -n 40  # the same pipeline on a CPU

1. Correctness: the CuPy ``RawKernel`` paged decode attention and the CuPy paths of
   ``paged_decode_attention`` / ``prefill_chunk_attention`` against the NumPy reference and
   ``tiled_softmax_dot`` (max abs error), on random paged caches.
2. Calibration of one model (``--model``, default TinyLlama-1.1B dims) on the device.
3. Validation: the engine's schedule executed on the device vs simulated with the profile.

Writes ``kernel_check.json``, ``profile.json``, ``validation.csv`` and ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from sim.costs.kernels import (array_module, paged_decode_attention, paged_decode_attention_cuda,
                               prefill_chunk_attention, tiled_softmax_dot)
from sim.costs.timing import QUICK_GRID, save_profile
from sim.tools.calibration import calibrate
from sim.tools.validation import validate_profile


def check_kernels(xp, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for b, nh, nkv, d, bs, max_len in [(3, 8, 2, 64, 16, 300), (16, 32, 8, 128, 16, 2048)]:
        nblocks = b * -(-max_len // bs) + 4
        k_pool = rng.standard_normal((nblocks, bs, nkv, d)).astype(np.float32)
        v_pool = rng.standard_normal((nblocks, bs, nkv, d)).astype(np.float32)
        perm = rng.permutation(nblocks)[: b * -(-max_len // bs)].reshape(b, -1).astype(np.int32)
        lens = rng.integers(1, max_len + 1, b).astype(np.int32)
        q = rng.standard_normal((b, nh, d)).astype(np.float32)
        ref = paged_decode_attention(q, k_pool, v_pool, perm, lens)
        scale = 1 / np.sqrt(d)
        tiled = np.stack([np.stack([
            tiled_softmax_dot(q[i, h].astype(np.float64) * scale,
                              k_pool[perm[i]].reshape(-1, nkv, d)[:lens[i], h // (nh // nkv)],
                              v_pool[perm[i]].reshape(-1, nkv, d)[:lens[i], h // (nh // nkv)])
            for h in range(nh)]) for i in range(b)])
        key = f"b{b}_h{nh}_kv{nkv}_d{d}"
        out[f"numpy_vs_tiled_{key}"] = float(np.abs(ref - tiled).max())
        if xp is not np:
            args = [xp.asarray(a) for a in (q, k_pool, v_pool, perm, lens)]
            raw = paged_decode_attention_cuda(*args).get()
            vec = paged_decode_attention(*args, xp=xp).get()
            out[f"rawkernel_vs_numpy_{key}"] = float(np.abs(raw - ref).max())
            out[f"cupy_vs_numpy_{key}"] = float(np.abs(vec - ref).max())
            c, p = 64, int(lens[0])
            kk = rng.standard_normal((p + c, nkv, d)).astype(np.float32)
            vv = rng.standard_normal((p + c, nkv, d)).astype(np.float32)
            qc = rng.standard_normal((c, nh, d)).astype(np.float32)
            pre_ref = prefill_chunk_attention(qc, kk, vv)
            pre_gpu = prefill_chunk_attention(xp.asarray(qc), xp.asarray(kk), xp.asarray(vv),
                                              xp=xp).get()
            out[f"prefill_cupy_vs_numpy_{key}"] = float(np.abs(pre_gpu - pre_ref).max())
    out["passed"] = all(v < 1e-3 for k, v in out.items() if k != "passed")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["gpu", "cpu", "auto"], default="gpu")
    ap.add_argument("--model", default="tinyllama-1.1b")
    ap.add_argument("--budget", type=float, default=90.0, help="calibration seconds")
    ap.add_argument("-n", "--requests", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="coarse calibration grid (smoke runs)")
    ap.add_argument("--engine-requests", type=int, default=300,
                    help="requests executed in the engine during calibration")
    ap.add_argument("--output", "-o", default="gpu-results")
    a = ap.parse_args(argv)
    try:
        xp, device = array_module(a.device)
    except (RuntimeError, ValueError) as e:  # e.g. --device gpu (the default) without a GPU
        raise SystemExit(f"gpu_check: error: {e} (use --device cpu to run the pipeline here)")
    out = Path(a.output)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    kernels = check_kernels(xp)
    (out / "kernel_check.json").write_text(json.dumps(kernels, indent=1))
    print(f"[{time.perf_counter() - t0:.0f}s] kernels on {device}: {kernels}", flush=True)
    model = a.model if xp is not np else None  # the CPU runs the small CPU model

    # one line per timing pass and one before the engine fit: a run cut short shows where
    def progress(p):
        what = (f"timing pass {p.passes} of {p.num_ops} ops, {p.elapsed_s:.0f}/{p.budget_s:g} s"
                if p.stage == "timing" else f"engine fit on {p.num_requests} executed requests")
        print(f"[{time.perf_counter() - t0:.0f}s] {what}", flush=True)

    profile = calibrate(model, budget_s=a.budget, device=a.device, on_progress=progress,
                        engine_requests=a.engine_requests, grid=QUICK_GRID if a.quick else None)
    save_profile(profile, out / "profile.json")
    print(f"[{time.perf_counter() - t0:.0f}s] calibrated {profile['model']['name']}: held-out "
          f"{ {k: round(v['median_ape_pct'], 1) for k, v in profile['heldout_error'].items()} }")
    val = validate_profile(profile, n=a.requests, repeats=a.repeats, device=a.device)
    val["table"].to_csv(out / "validation.csv")
    summary = {"device": device, "kernels_passed": kernels["passed"],
               "heldout_error": profile["heldout_error"],
               "iteration_error": val["iteration_error"], "rate": val["rate"],
               "validation": val["table"][["executed", "simulated", "error_pct"]].to_dict(),
               "seconds": round(time.perf_counter() - t0, 1)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    print(val["table"].to_string())
    print(f"[{summary['seconds']}s] wrote {out}/")
    return summary


if __name__ == "__main__":
    main()
