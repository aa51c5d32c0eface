"""One script for every GPU check: CuPy kernels vs NumPy, calibration, validation.

    python experiments/gpu_check.py --output gpu-results/            # on an NVIDIA GPU
    python experiments/gpu_check.py --device cpu --budget 10 -n 40  # the same pipeline on a CPU

1. Correctness: the CuPy ``RawKernel`` paged decode attention and the CuPy paths of
   ``paged_decode_attention`` / ``prefill_chunk_attention`` against the NumPy reference and
   ``tiled_softmax_dot`` (max abs error), on random paged caches.
2. Calibration of one model (``--model``; default TinyLlama-1.1B's dims on a GPU, the small
   CPU model on a CPU) on the device, printing a line per timing pass (the first H200 run had
   not finished it at 6 minutes with the 90 s budget).
3. Validation: the engine's schedule executed on the device vs simulated with the profile.

Writes ``kernel_check.json``, ``profile.json``, ``validation.csv`` and ``summary.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from sim.cli.arguments import number, output_folder, preset
from sim.cli.device import check_device, progress_line
from sim.cli.main import Parser
from sim.costs.kernels import (array_module, paged_decode_attention, paged_decode_attention_cuda,
                               prefill_chunk_attention, tiled_softmax_dot)
from sim.costs.timing import QUICK_GRID, save_profile
from sim.specs.models import get_model
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


def parse(argv=None):
    """The flags, checked before any work: each bad value (an unknown ``--model``, a count or
    budget not > 0, an output folder that cannot be written, ``--device gpu`` without a GPU) is
    one line, ``gpu_check: error: ...``, and exit status 2."""
    ap = Parser(prog="gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["gpu", "cpu", "auto"], default="gpu",
                    help="gpu: CuPy (default); cpu: NumPy, the same pipeline on a CPU; auto: a "
                         "GPU if usable")
    ap.add_argument("--model", default=None,
                    help="model preset to calibrate (an unknown name lists them) (default: "
                         "tinyllama-1.1b on a GPU, the small 2-layer CPU model on a CPU)")
    ap.add_argument("--budget", type=number(float), default=90.0, metavar="SECONDS",
                    help="calibration seconds, > 0; at least 3 timing passes, so longer where a "
                         "pass takes more than a third of it (default 90)")
    ap.add_argument("-n", "--requests", type=number(int), default=300, metavar="N",
                    help="requests of the validation workload, >= 1 (default 300)")
    ap.add_argument("--repeats", type=number(int), default=2, metavar="N",
                    help="executed validation runs, >= 1 (default 2)")
    ap.add_argument("--quick", action="store_true",
                    help="coarse calibration grid (smoke runs) (default: the full grid)")
    ap.add_argument("--engine-requests", type=number(int), default=300, metavar="N",
                    help="requests executed in the engine during calibration, >= 1 "
                         "(default 300)")
    ap.add_argument("--output", "-o", default="gpu-results", metavar="FOLDER",
                    help="folder of the four result files, created if missing "
                         "(default gpu-results)")

    def check(a):
        check_device(a.device)
        output_folder(a.output, "--output")
        if a.model is not None:
            preset(get_model, a.model, "--model")
    return ap.parse_checked(argv, check)


def main(argv=None):
    a = parse(argv)
    xp, device = array_module(a.device)
    out = Path(a.output)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    kernels = check_kernels(xp)
    (out / "kernel_check.json").write_text(json.dumps(kernels, indent=1))
    print(f"[{time.perf_counter() - t0:.0f}s] kernels on {device}: {kernels}", flush=True)
    # a GPU calibrates TinyLlama-1.1B's dims unless told; a CPU the small CPU model (None)
    model = a.model if a.model is not None or xp is np else "tinyllama-1.1b"

    def progress(p):  # one line per timing pass and one as the engine fit begins, as sim
        # calibrate prints them: a run cut short shows where it was
        print(f"[{time.perf_counter() - t0:.0f}s] {progress_line(p)}", flush=True)

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
