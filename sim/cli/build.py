"""From checked settings (:mod:`sim.cli.settings`) to the run's workload and ``SimConfig``.

:func:`parts` reads the settings once through the table (:mod:`sim.cli.table`): each given
value goes to its row's targets under its API field (``closed_loop_users`` to
``ClosedLoop.num_users``, ``num_requests`` to ``workloads.load``'s ``n``). :func:`config_from`
builds the config objects from those parts - ``SpeculativeConfig``, ``ClosedLoop``,
``Disaggregation``, the cost model - and the ``SimConfig`` in one call; :func:`build` loads the
workload and checks the config through to its KV pool and cost model. A library error names
the API's field; :func:`as_written` names it as the user wrote it (``--chunk-size 100``,
``exp.toml: chunk_size 100``). :func:`with_request_path` adds ``sim run``'s and ``sim
capacity``'s own ``request_path`` to the config.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import warnings

from .arguments import read_profile
from .build_tiers import tier_chain
from .table_lora import lora_from, with_lora_ids
from .settings import given_value
from .table import BY_KEY, SETTINGS

# when a config object is made: a field of it given (others alone take its defaults)
MADE_BY = {"closed_loop": ("num_users",),
           "disaggregation": ("prefill_replicas", "decode_replicas"),
           "kv_offload": ("capacity_gb",)}
# the workload loader's argument names for settings of other names (its message says "n=...")
LOADER_NAMES = {row.api_field: row.key for row in SETTINGS
                if row.to == ("workload",) and row.field and row.key != "workload"}


def parts(s) -> dict:
    """``{target: {field: value}}``: every value the settings ``s`` hold (None: not given, the
    target's default) under its row's API field, for each of the row's targets."""
    out = {}
    for row in SETTINGS:
        top, _, sub = row.key.partition(".")
        if top not in s:
            continue
        value = s[top].get(sub) if sub else s[top]
        if value is None:
            continue
        for target in row.to:
            out.setdefault(target, {})[row.api_field] = value
    return out


def profile_model_mismatch(cost, s) -> str | None:
    """Why a calibrated profile's prices and the KV pool describe different models, or None:
    the profile prices the model it timed, while ``--model`` (on ``--gpu``) sizes the pool
    unless ``--kv-blocks`` gives it."""
    from ..specs.models import get_model
    timed = cost.profile.get("model", {}).get("name")
    sized = get_model(s["model"]).name
    if s["kv_blocks"] is not None or not timed or timed.lower() == sized.lower():
        return None
    return (f"the profile prices {timed!r} (the model it timed) but the KV pool is sized for "
            f"{sized!r} on {s['gpu']!r} (--model, --gpu): give --kv-blocks N, or --model for "
            f"the profiled model")


def fit_profile_cost(profile, s):
    """The roofline of ``--model`` on ``--gpu`` with a ``sim fit`` profile's terms; a warning
    when the profile was fitted on another GPU (its terms describe that GPU's engine)."""
    from ..costs.fitted import fitted_roofline, profile_terms
    from ..specs.gpus import get_gpu
    terms = profile_terms(profile, f"--profile {str(s['profile'])!r}")
    fitted_on = (profile.get("fitted_to") or {}).get("gpu")
    if fitted_on and get_gpu(fitted_on).name != get_gpu(s["gpu"]).name:
        # (a warning: ``sim COMMAND: warning: ...`` as the command that built it, one line)
        warnings.warn(f"the profile was fitted on {fitted_on!r}, the run is on {s['gpu']!r}: "
                      f"its terms describe another GPU's engine", stacklevel=2)
    return fitted_roofline(terms, s["model"], s["gpu"], tensor_parallel=s["tensor_parallel"],
                           weight_dtype=s["weight_dtype"], kv_dtype=s["kv_dtype"],
                           expert_parallel=s["expert_parallel"], expert_skew=s["expert_skew"],
                           attention_dp=s["attention_dp"],
                           expert_weight_dtype=s["expert_weight_dtype"])


def cost_model_from(s):
    """The cost model the settings name: ``--profile`` (a calibrated profile) wins, else
    ``--cost``: ``roofline`` (``None``: SimConfig builds the roofline of model on gpu),
    ``constant:SECONDS`` or ``linear:BASE,PREFILL,DECODE,CONTEXT``."""
    from ..costs.simple import ConstantCost, LinearCost
    if s["profile"]:
        from ..costs.calibrated import CalibratedCost
        from ..costs.fitted import is_fit_profile
        profile = read_profile(s["profile"])
        if is_fit_profile(profile):
            return fit_profile_cost(profile, s)
        try:
            cost = CalibratedCost(profile)
        except ValueError as e:  # (a JSON object of another kind: name the file)
            raise ValueError(f"--profile {str(s['profile'])!r}: {e}; write one with 'sim fit' "
                             f"or 'sim calibrate'") from None
        for note in (cost.warning(), profile_model_mismatch(cost, s)):
            if note:
                warnings.warn(note, stacklevel=2)
        return cost
    spec = s["cost"]
    if spec == "roofline":
        return None  # SimConfig resolves the roofline of model on gpu
    usage = "use roofline, constant:SECONDS or linear:BASE,PREFILL,DECODE,CONTEXT"
    kind, _, rest = spec.partition(":")
    try:
        nums = [float(x) for x in rest.split(",") if x]
    except ValueError:
        raise ValueError(f"cost {spec!r}: numbers expected after ':'; {usage}") from None
    try:
        if kind == "constant" and len(nums) == 1:
            return ConstantCost(nums[0])
        if kind == "linear" and len(nums) == 4:
            return LinearCost(*nums)
        if kind == "linear":
            raise ValueError(f"four numbers expected (BASE,PREFILL,DECODE,CONTEXT: seconds, "
                             f"and seconds per prefill, decode and context token; write 0 "
                             f"for a term not wanted), got {len(nums)}")
    except (ValueError, TypeError) as e:
        raise ValueError(f"cost {spec!r}: {e}") from None
    raise ValueError(f"cost {spec!r}: {usage}")


def _speculative(spec, names=None):
    """The ``SpeculativeConfig`` of the ``[speculative]`` fields ``spec`` (None: off); an error
    names the keys as written: from the file, ``exp.toml: speculative.method ...`` or
    ``exp.toml: [speculative] ...``; from flags, each key as its flag (``--draft-model``,
    ``--spec-method ngram``)."""
    from ..engine import SpeculativeConfig
    if not spec:
        return None
    try:
        return SpeculativeConfig(**spec)
    except (ValueError, TypeError) as e:
        if names is None:
            raise
        msg, head = str(e), ""
        m = _LEADING.match(msg)
        if m and m.group(1) in spec:
            head, msg = names(f"speculative.{m.group(1)}") + " ", m.group(2)
        elif names.table("speculative"):
            head = f"{names.config}: [speculative] "
        if not names.table("speculative"):  # the flags' voice
            msg = re.sub(r"(?<![\w.-])(\w+)(?:='(\w+)')?", lambda w: " ".join(filter(None, (
                _spec_flag(w.group(1)), w.group(2)))) if _spec_flag(w.group(1))
                else w.group(0), msg)
        raise type(e)(head + msg) from None


def _spec_flag(field):
    """The flag of the ``[speculative]`` field ``field``, or None."""
    row = BY_KEY.get(f"speculative.{field}")
    return row.flags[0] if row is not None and row.flags else None


def config_from(s, names=None):
    """The ``SimConfig`` of the settings ``s``, with its config objects, in one pass over the
    table (:func:`parts`)."""
    import workloads
    from ..engine import Disaggregation, KVTier, SimConfig
    p = parts(s)
    speculative = _speculative(p.get("speculative"), names)
    paced = s.get("max_concurrency") is not None  # vLLM's --max-concurrency: its own loop
    if paced and s.get("closed_loop_users") is not None:
        raise ValueError("max_concurrency (vLLM's cap on requests in flight, sent at their "
                         "arrival times) and closed_loop_users exclude each other: give one")
    made = {"closed_loop": workloads.MaxConcurrency if paced else workloads.ClosedLoop,
            "disaggregation": Disaggregation,
            "kv_offload": KVTier}
    objects = {target: cls(**p[target]) for target, cls in made.items()
               if any(field in p.get(target, {}) for field in MADE_BY[target])}
    if "kv_tiers" in p:  # a chain of offload tiers (sim.cli.table_offload)
        objects["kv_offload"] = tier_chain(p["kv_tiers"], objects.get("kv_offload"),
                                           p.get("kv_offload", {}))
    pools = {k: p[f"{k}_pool"] for k in ("prefill", "decode") if f"{k}_pool" in p}
    if pools and "disaggregation" in objects:  # (sim.cli.table_hetero: a pool's GPU, TP, price;
        # without pools, an error of sim.cli.settings)
        objects["disaggregation"] = Disaggregation(**p["disaggregation"], **pools)
    return SimConfig(**p.get("config", {}), speculative=speculative,
                     cost_model=cost_model_from(s), lora=lora_from(p), **objects)


def check_offload(s, cfg) -> None:
    """An offload tier needs a prefix cache: said before the run, in the user's words (the
    engine's own error comes at the run and names SimConfig's fields)."""
    mode = cfg.resolved().prefix_caching if cfg.kv_offload is not None else "block"
    if mode not in ("block", "radix"):
        got = (f"prefix_caching={mode!r}" if s.get("prefix_caching") is not None else
               f"the {cfg.resolved().scheduler!r} scheduler's default: {mode or 'off'}")
        raise ValueError(f"offload_gb {s['offload_gb']:g} needs prefix_caching='block' or "
                         f"'radix' (the offload tier sits under the prefix cache), got {got}")


def build(s, names=None, fits=True):
    """(workload DataFrame, SimConfig) from settings, the config checked through to its KV
    pool and cost model; ``names`` (a :class:`Names`): an error names each setting as the user
    wrote it (``exp.toml: chunk_size``, ``--chunk-size``, ``--tp 2``, ``--rate``). ``fits``
    False: the base of a sweep's grid or a plan's space, whose points set their own GPU,
    parallelism and dtypes: a model that does not fit the base is no error here (each point
    that does not fit is an error row or a pruned candidate)."""
    import workloads
    from workloads.vllm_bench import BENCH_WORKLOADS
    from ..engine.simulation import cache_unit
    from .footprint import check_footprint
    load = parts(s)["workload"]
    try:
        if workloads.TRACES.get(load.get("name"), ("", ""))[1] == "lengths" \
                or load.get("name") in BENCH_WORKLOADS:  # (resampled or drawn to any n: a
            # trace or file with fewer rows is an error before anything is allocated)
            check_footprint(load.get("n"), names("num_requests") if names else "num_requests")
        with warnings.catch_warnings():  # (--seed unused: said of it as a whole by the
            warnings.filterwarnings("ignore", message="seed=")  # command, warn_unused_seed)
            try:
                df = workloads.load(**load)
            except ValueError as e:  # a closed loop issues requests itself: no arrivals needed
                if s["closed_loop_users"] is None or "no arrival times" not in str(e):
                    raise
                df = workloads.load(**dict(load, rate=1.0))
        df = with_lora_ids(df, parts(s), s.get("seed") or 0)  # --lora-adapters (table_lora)
        cfg = config_from(s, names)
        if fits:  # (a sweep's or plan's base: its points may set the prefix cache)
            check_offload(s, cfg)
        try:
            cfg.resolved_kv_blocks()  # a model that does not fit, a TP the model refuses: now
        except ValueError as e:
            if fits or "does not fit" not in str(e):
                raise
        cfg.resolved_cost_model()
        cache_unit(df, cfg.resolved())  # the workload's hash ids and the prefix cache's pages
        return df, cfg
    except (ValueError, TypeError) as e:
        if names is None:
            raise
        raise type(e)(as_written(str(e), s, names)) from None


def seed_changes_nothing(s, cfg) -> bool:
    """Whether the settings' seed changes nothing: the workload is the same for another seed
    (a replayed trace or a file: only a length-only set's arrivals and resampling draw from
    it) and the engine draws nothing at random (:meth:`SimConfig.draws_at_random`)."""
    import workloads
    if cfg.draws_at_random():
        return False
    load = {k: v for k, v in parts(s)["workload"].items() if k != "seed"}
    with warnings.catch_warnings():  # (the loader's own "seed= changes nothing": the answer)
        warnings.filterwarnings("ignore", message="seed=")
        return workloads.load(**load, seed=s["seed"]).equals(workloads.load(**load,
                                                                            seed=s["seed"] + 1))


def warn_unused_seed(command, s, cfg, names) -> None:
    """One line on stderr when ``--seed`` (or the TOML's ``seed``) is given and changes
    nothing (:func:`seed_changes_nothing`), in the flag's words; every command that takes it
    says the same (the loader's and the engine's own ``seed=`` warnings are then hushed)."""
    if s["seed"] and seed_changes_nothing(s, cfg):
        print(f"sim {command}: warning: {names('seed')} {s['seed']} changes nothing: workload "
              f"{s['workload']} is replayed as recorded (only a length-only set such as "
              f"sharegpt draws its arrivals from the seed) and nothing in the engine draws "
              f"at random (speculative decoding, --router random)", file=sys.stderr)


def warn_pool(command, s, cfg, names) -> None:
    """One line on stderr, in the flags' words (``--kv-blocks 100,000 is a pool of ...``), when
    the KV pool set by hand exceeds the memory budget; the engine's own ``kv_blocks=`` warning
    (the API's words, once per run of a search) is then hushed in the caller's filters."""
    from ..engine.simulation import pool_warning
    over = pool_warning(cfg, cfg.resolved_kv_blocks())
    if over:
        print(f"sim {command}: warning: {as_written(over, s, names)}", file=sys.stderr)
        warnings.filterwarnings("ignore", message="kv_(blocks|tokens)=")


REFERENCE_RATE = 1.0  # req/s: a length-only set's arrivals where every run re-scales them


def build_rescaled(s, names, rescaled=True, fits=True):
    """``(build(s, names, fits), s)``; when ``rescaled`` (each run time-scales the workload to
    a rate of its own: sim sweep's grid rates, sim capacity's search) a length-only set given
    no rate draws its Poisson arrivals at ``REFERENCE_RATE`` instead of being an error, and the
    settings returned say so. A fixed reference, not a rate of the grid: the base workload
    (which a sweep's resume fingerprint hashes) must not change when the rates do."""
    from workloads.vllm_bench import BENCH_WORKLOADS
    if rescaled and s["rate"] is None and s["workload"] in BENCH_WORKLOADS:
        s = dict(s, rate=REFERENCE_RATE)  # (its default rate, inf, sends all at 0: no rate)
        return build(s, names, fits), s
    try:
        return build(s, names, fits), s
    except ValueError as e:
        if not rescaled or s["rate"] is not None or "no arrival times" not in str(e):
            raise
    s = dict(s, rate=REFERENCE_RATE)
    return build(s, names, fits), s


_LEADING = re.compile(r"(\w+)(?:=| )(.*)", re.S)  # "chunk_size=100 is ...", "cost 'x': ..."


def as_written(msg, s, names) -> str:
    """``msg`` with the API's names of settings replaced by the user's (flag or file key): a
    message that starts with a setting (``chunk_size 100 ...``, ``chunk_size=100 ...``) names
    it as written (``--chunk-size 100 ...``, ``exp.toml: chunk_size 100 ...``)."""
    m = _LEADING.match(msg)
    if m and m.group(1) in LOADER_NAMES:  # workloads.load's count: "n=10,000,000 is more ..."
        key = LOADER_NAMES[m.group(1)]
        msg = f"{names(key)} {m.group(2)}".replace(f"omit {m.group(1)} ",
                                                   f"omit {names.like(key, key)} ")
    elif m and m.group(1) in s and m.group(1) != "speculative":
        # a further setting it names as the API's keyword (``... which kv_blocks=100 gives``,
        # ``... it needs enable_chunked_context=True``): as written too (``--kv-blocks 100``;
        # from the file, its bare key: ``kv_blocks = 100``)
        rest = re.sub(r"(?<![\w.-])(\w+)=('[^']*'|[^\s,;:)]+)", lambda w: (
            names.like(m.group(1), w.group(1), w.group(2))
            if w.group(1) in s and w.group(1) not in ("speculative", "extra") else w.group(0)),
            m.group(2))
        msg = f"{names(m.group(1))} {rest}"
    elif m and m.group(1) in s["speculative"]:  # e.g. SimConfig's draft_model checks
        msg = f"{names('speculative.' + m.group(1))} {m.group(2)}"
    msg = re.sub(r"\(tensor_parallel=(\d+)\)",
                 lambda m: f"({names('tensor_parallel')} {m.group(1)})", msg)
    return msg.replace("give rate= (requests/s) or arrival_times=",
                       f"give {names('rate')} REQ_PER_S")


def request_path_from(shown, spec):
    """The ``RequestPath`` of ``--request-path`` (or the TOML key, ``shown`` as written):
    ``triton`` (the sourced front end, ``sim.engine.fleet.request_path``),
    ``IN_MS,US_PER_TOKEN,OUT_MS`` or ``off`` (None)."""
    from ..engine.fleet.request_path import RequestPath, triton_path
    if not isinstance(spec, str):
        raise ValueError(f"{shown} must be a string: triton, off or IN_MS,US_PER_TOKEN,OUT_MS, "
                         f"got {spec!r}")
    text = spec.strip().lower()
    if text == "off":
        return None
    if text == "triton":
        return triton_path()
    parts = text.split(",")
    try:
        in_ms, us, out_ms = (float(x) for x in parts)
    except ValueError:
        raise ValueError(f"{shown} must be triton, off or IN_MS,US_PER_TOKEN,OUT_MS "
                         f"(three numbers), got {spec!r}") from None
    for name, value in (("IN_MS", in_ms), ("US_PER_TOKEN", us), ("OUT_MS", out_ms)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{shown} {name} must be a finite number >= 0, got "
                             f"{value!r} in {spec!r}")
    return RequestPath(in_s=in_ms * 1e-3, per_prompt_token_s=us * 1e-6, out_s=out_ms * 1e-3)


def with_request_path(cfg, args, s):
    """``cfg`` with the request path of ``--request-path`` or, without the flag, of the TOML
    key (``s["extra"]``); unchanged when neither is given. A closed loop beside one is refused
    naming the setting as written."""
    spec, shown = given_value(args, s, "request_path")
    if shown is None:
        return cfg
    path = request_path_from(shown, spec)
    try:
        return dataclasses.replace(cfg, request_path=path)
    except ValueError as e:  # (with a closed loop)
        raise ValueError(f"{shown}: {e}") from None
