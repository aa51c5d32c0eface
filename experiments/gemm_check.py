"""Time one model's per-layer GEMMs on this device and compare with the roofline's price.

    python experiments/gemm_check.py --gpu h200 -o gemm_h200.csv   # on an NVIDIA GPU (fp16)
    python experiments/gemm_check.py --device cpu --tokens 1 16     # the same code on a CPU

For each token count and each of the four dense GEMMs of a layer (``attn_pre_proj`` = QKV,
``attn_post_proj`` = O, ``mlp_up_proj`` = gate+up, ``mlp_down_proj``) it times
``x (tokens, k) @ W (k, n)`` (CuPy on a GPU in float16, whose tensor-core rate on Hopper is
bf16's; NumPy float32 on a CPU) and writes the median of ``--repeats`` timed products next to
:meth:`RooflineCost.op_times` for ``--gpu`` (no fit: the shipped parameters). On a CPU the
comparison says nothing about the roofline; it only runs the pipeline.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from sim.costs.kernels import array_module, synchronize
from sim.costs.roofline import RooflineCost

OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
TOKENS = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def shapes(model) -> dict:
    """``op -> (k, n)`` of each dense GEMM of one layer (tensor parallel 1)."""
    m = model
    gate = 2 if m.gated_mlp else 1
    return {"attn_pre_proj": (m.hidden_size, m.q_size + 2 * m.kv_size),
            "attn_post_proj": (m.q_size, m.hidden_size),
            "mlp_up_proj": (m.hidden_size, gate * m.intermediate_size),
            "mlp_down_proj": (m.intermediate_size, m.hidden_size)}


def time_gemm(xp, tokens, k, n, dtype, repeats, rng) -> float:
    """Median seconds of ``repeats`` products ``(tokens, k) @ (k, n)`` after 3 warm-ups."""
    x = xp.asarray(rng.standard_normal((tokens, k), dtype=np.float32)).astype(dtype)
    w = xp.asarray(rng.standard_normal((k, n), dtype=np.float32) * 0.02).astype(dtype)
    for _ in range(3):
        xp.matmul(x, w)
    times = []
    if xp is np:
        for _ in range(repeats):
            t0 = time.perf_counter()
            np.matmul(x, w)
            times.append(time.perf_counter() - t0)
    else:
        start, end = xp.cuda.Event(), xp.cuda.Event()
        for _ in range(repeats):
            start.record()
            xp.matmul(x, w)
            end.record()
            end.synchronize()
            times.append(xp.cuda.get_elapsed_time(start, end) / 1e3)
    synchronize(xp)
    return float(np.median(times))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["gpu", "cpu", "auto"], default="gpu")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="h200", help="the roofline's GPU preset to compare with")
    ap.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--output", "-o", default="gemm_check.csv")
    a = ap.parse_args(argv)
    try:
        xp, device = array_module(a.device)
    except (RuntimeError, ValueError) as e:
        raise SystemExit(f"gemm_check: error: {e} (use --device cpu to run the pipeline here)")
    cost = RooflineCost(a.model, a.gpu)
    dtype = np.float32 if xp is np else np.float16
    rng = np.random.default_rng(0)
    rows = []
    for tokens in a.tokens:
        priced = cost.op_times(tokens)
        for op, (k, n) in shapes(cost.model).items():
            measured = time_gemm(xp, tokens, k, n, dtype, a.repeats, rng)
            rows.append({"device": device, "model": cost.model.name, "op": op, "tokens": tokens,
                         "k": k, "n": n, "measured_s": measured, "roofline_s": priced[op],
                         "tflops": 2.0 * tokens * k * n / measured / 1e12,
                         "error_pct": 100.0 * (priced[op] - measured) / measured})
    df = pd.DataFrame(rows)
    df.to_csv(a.output, index=False)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"median |error| {df['error_pct'].abs().median():.1f}% over {len(df)} GEMMs "
          f"({device} vs roofline {a.gpu}); wrote {a.output}")
    return df


if __name__ == "__main__":
    main()
