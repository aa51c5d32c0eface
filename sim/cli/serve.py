"""``sim serve``: the simulated engine behind an OpenAI-compatible HTTP endpoint, in real time.

Takes ``sim run``'s engine settings (model, GPU, scheduler/preset, KV pool, cost model,
speculative decoding, ``--replicas`` behind a ``--router``: the table's rows; no workload, no
disaggregation, no output files) plus
``--host``, ``--port``, ``--time-scale`` (wall seconds per simulated second),
``--served-model-name`` and ``--max-concurrency`` (more requests in flight: HTTP 429); the
settings are checked, and the model's KV pool and cost model built, before the server starts.
Runs until SIGINT/SIGTERM (:mod:`sim.serve`). Needs the ``serve`` extra.
"""

from __future__ import annotations

import math
import socket
import sys

from .build import as_written, config_from
from .settings import Names, add_flags, settings_from
from .table import rows_for

# sim run's settings that are no engine's (bands: the reruns of a finished run, not a live one)
NOT_HERE = ("usd_per_gpu_hour", "gpu_idle_watts", "gpu_max_watts", "bands")
TARGETS = ("config", "cost", "speculative")


def cmd_serve(args) -> int:
    from ..serve import require_server, serve
    require_server()  # (the missing extra named before the banner says it listens)
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    if not (math.isfinite(args.time_scale) and args.time_scale > 0):
        raise ValueError(f"--time-scale must be a number > 0, got {args.time_scale}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    try:  # (uvicorn's own failure came after the banner, as a log line)
        socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise ValueError(f"--host {args.host!r} is no address to listen on "
                         f"({getattr(e, 'strerror', None) or e})") from None
    names = Names(None)
    s = settings_from(args, names, "run")
    try:
        cfg = config_from(s, names)
        cfg.resolved_kv_blocks()  # a model that does not fit: now, not at the first request
        cfg.resolved_cost_model()
    except (ValueError, TypeError) as e:
        raise type(e)(as_written(str(e), s, names)) from None
    model = args.served_model_name or s["model"]
    fleet = f"{cfg.replicas} replicas behind {cfg.router}, " if cfg.replicas > 1 else ""
    print(f"sim serve: {s['model']} on {s['gpu']}, {fleet}scheduler {cfg.policy()!r}; "
          f"http://{args.host}:{args.port}/v1 as model {model!r}, "
          f"time scale {args.time_scale:g} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    serve(cfg, args.host, args.port, args.time_scale, model,
          max_concurrency=args.max_concurrency)
    print("sim serve: stopped", file=sys.stderr)
    return 0


def add_parser(sub):
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP endpoint that simulates in "
                                     "real time")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: "
                                                       "127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--time-scale", type=float, default=1.0, metavar="S",
                   help="wall seconds per simulated second: 1 is real time, 10 ten times "
                        "slower (default: 1)")
    p.add_argument("--max-concurrency", type=int, default=None, metavar="N",
                   help="at most N requests in flight; another is an HTTP 429 with the reason "
                        "(default: no limit)")
    p.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the model name clients send and /v1/models lists (default: --model)")
    add_flags(p, [r for r in rows_for("run") if r.to[0] in TARGETS and r.key not in NOT_HERE])
    p.set_defaults(func=cmd_serve, config=None)
