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

import time
from pathlib import Path

import numpy as np
import pandas as pd

from sim.cli.arguments import number, output_file, preset
from sim.cli.device import check_device
from sim.cli.main import Parser
from sim.costs.kernels import array_module
from sim.costs.roofline import RooflineCost
from sim.specs.gpus import get_gpu, gpu_presets
from sim.specs.models import get_model

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
    return float(np.median(times))


def parse(argv=None):
    """The flags, checked before any timing: each bad value (an unknown ``--model`` or
    ``--gpu``, ``--tokens 0``, ``--repeats 0``, an output that cannot be written, ``--device
    gpu`` without a GPU) is one line, ``gemm_check: error: ...``, and exit status 2."""
    ap = Parser(prog="gemm_check", description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["gpu", "cpu", "auto"], default="gpu",
                    help="gpu: CuPy, float16 (default); cpu: NumPy, float32, which runs the "
                         "pipeline but says nothing about the roofline; auto: a GPU if usable")
    ap.add_argument("--model", default="llama-3.1-8b",
                    help="model preset whose layer GEMMs are timed (an unknown name lists them) "
                         "(default llama-3.1-8b)")
    ap.add_argument("--gpu", default="h200",
                    help=f"the GPU preset whose roofline prices them: {', '.join(gpu_presets())} "
                         f"(default h200)")
    ap.add_argument("--tokens", type=number(int), nargs="+", default=list(TOKENS), metavar="N",
                    help=f"token counts (each GEMM's rows), each >= 1 (default "
                         f"{' '.join(map(str, TOKENS))})")
    ap.add_argument("--repeats", type=number(int), default=20, metavar="N",
                    help="timed products per GEMM and token count, >= 1, after 3 warm-ups; "
                         "their median is kept (default 20)")
    ap.add_argument("--output", "-o", default="gemm_check.csv", metavar="CSV",
                    help="the CSV file to write, its folder created if missing "
                         "(default gemm_check.csv)")

    def check(a):
        check_device(a.device)
        output_file(a.output, "--output")
        preset(get_model, a.model, "--model")
        preset(get_gpu, a.gpu, "--gpu")
    return ap.parse_checked(argv, check)


def main(argv=None):
    a = parse(argv)
    xp, device = array_module(a.device)
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
    Path(a.output).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(a.output, index=False)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"median |error| {df['error_pct'].abs().median():.1f}% over {len(df)} GEMMs "
          f"({device} vs roofline {a.gpu}); wrote {a.output}")
    return df


if __name__ == "__main__":
    main()
