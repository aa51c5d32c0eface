"""Real traces bundled with the package, and loading workload files.

| name | source (license) | arrivals | prefix |
|---|---|---|---|
| ``azure-code``, ``azure-conv`` | Azure LLM inference trace 2023, Splitwise (CC-BY-4.0) | replayed | - |
| ``mooncake-conversation``, ``mooncake-synthetic`` | Mooncake FAST'25 (Apache-2.0) | replayed | ``hash_ids``, 512-token blocks |
| ``sharegpt``, ``arxiv``, ``bwb`` | Etalon / Vidur length sets (Apache-2.0 / MIT) | lengths only: give ``rate`` or ``arrival_times`` | - |

Sources, commits and checksums: ``workloads/data/NOTICE.md``. Files are gzip copies of the
upstream files, byte for byte once decompressed.
"""

from __future__ import annotations

import difflib
import json
import zlib
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from .agentic import AGENTIC_NAME, load_agentic
from .arrivals import (CV_KEY, RATE_KEY, _rng, _same, cv_for, drawn_at, gamma, poisson,
                       scale_to_rate, seed_unused)
from .json_bools import check_json_booleans, first_bad_line
from .lines import as_lines
from .schema import check_hash_id_counts, validate
from .vllm_bench import BENCH_ARGS, BENCH_WORKLOADS, load_bench

TRACES = {
    "azure-code": ("azure_llm_2023_code.csv.gz", "azure"),
    "azure-conv": ("azure_llm_2023_conv.csv.gz", "azure"),
    "mooncake-conversation": ("mooncake_fast25_conversation_trace.jsonl.gz", "mooncake"),
    "mooncake-synthetic": ("mooncake_fast25_synthetic_trace.jsonl.gz", "mooncake"),
    "sharegpt": ("etalon_sharegpt_8k_lengths.csv.gz", "lengths"),
    "arxiv": ("vidur_arxiv_summarization_lengths.csv.gz", "lengths"),
    "bwb": ("etalon_bwb_lengths.csv.gz", "lengths"),
}
MOONCAKE_BLOCK_SIZE = 512


def trace_names() -> list[str]:
    """The bundled traces' names, then the benchmark tools' generated workloads'."""
    return list(TRACES) + list(BENCH_WORKLOADS) + [AGENTIC_NAME]


def _open(fname):
    return resources.files("workloads").joinpath("data", fname).open("rb")


def _read(name) -> pd.DataFrame:
    fname, kind = TRACES[name]
    with _open(fname) as f:
        if kind == "azure":
            raw = pd.read_csv(f, compression="gzip")
            ts = pd.to_datetime(raw["TIMESTAMP"], format="%Y-%m-%d %H:%M:%S.%f")
            df = pd.DataFrame({"arrival_time": (ts - ts.iloc[0]).dt.total_seconds().to_numpy(),
                               "num_prompt_tokens": raw["ContextTokens"].to_numpy(),
                               "num_output_tokens": raw["GeneratedTokens"].to_numpy()})
        elif kind == "mooncake":
            raw = pd.read_json(f, lines=True, compression="gzip")
            df = pd.DataFrame({"arrival_time": raw["timestamp"].to_numpy() / 1000.0,
                               "num_prompt_tokens": raw["input_length"].to_numpy(),
                               "num_output_tokens": raw["output_length"].to_numpy(),
                               "hash_ids": raw["hash_ids"]})
            df.attrs["block_size"] = MOONCAKE_BLOCK_SIZE
            check_hash_id_counts(df, MOONCAKE_BLOCK_SIZE, f"the {name!r} trace: ")
        else:
            raw = pd.read_csv(f, compression="gzip")
            df = pd.DataFrame({"num_prompt_tokens": raw["num_prefill_tokens"].to_numpy(),
                               "num_output_tokens": raw["num_decode_tokens"].to_numpy()})
    df.attrs["name"] = name
    return df


def _num_requests(n):
    """``n`` as an int >= 1 (or None): the count of requests asked for."""
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n (the number of requests) must be an integer, got {n!r}")
    if n < 1:
        raise ValueError(f"n (the number of requests) must be >= 1, got {int(n)}"
                         + (": an empty workload has nothing to simulate" if n == 0 else ""))
    return int(n)


def _max_context(max_context):
    if max_context is None:
        return None
    if isinstance(max_context, bool) or not isinstance(max_context, (int, np.integer)) \
            or max_context < 2:
        raise ValueError(f"max_context must be an integer >= 2 (prompt + output tokens), got "
                         f"{max_context!r}")
    return int(max_context)


def _first(df, n, what) -> pd.DataFrame:
    """The first ``n`` rows; more than there are is an error (a replay is never resampled)."""
    if n is None:
        return df
    if n > len(df):
        raise ValueError(f"n={n:,} is more than the {len(df):,} requests of {what}; omit n to "
                         f"take all of them")
    return df.iloc[:n].reset_index(drop=True)


def _within_context(df, max_context, what) -> pd.DataFrame:
    if max_context is None:
        return df
    keep = ((df["num_prompt_tokens"] + df["num_output_tokens"]) <= max_context).to_numpy()
    if not keep.any():
        raise ValueError(f"max_context={max_context:,} drops every request of {what}: "
                         f"nothing to simulate")
    return df[keep].reset_index(drop=True)


def _unknown_name(name) -> ValueError:
    close = difflib.get_close_matches(str(name), trace_names(), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ValueError(f"workload {name!r} is neither a bundled trace nor a file; {hint}"
                      f"bundled: {', '.join(trace_names())}")


def _replayed(what, arrival, cv, arrival_times) -> None:
    """A trace or file with arrival times replays them: the arguments that would draw others
    are an error (they were silently ignored: ``arrival_times=`` gave the trace's own)."""
    given = [f"{k}={v!r}" for k, v, default in (("arrival", arrival, "poisson"), ("cv", cv, 1.0))
             if not _same(v, default)]
    if arrival_times is not None:
        given.insert(0, "arrival_times=")
    if given:
        raise ValueError(f"{', '.join(given)}: for the arrivals of a length-only set; {what} "
                         f"has its own arrival times (rate= time-scales them)")


def _arrival_args(name, rate, arrival, cv, arrival_times) -> None:
    """A length-only set: ``rate`` or ``arrival_times``, not both; ``cv`` with gamma only."""
    if arrival_times is not None and rate is not None:
        raise ValueError(f"{name!r}: give rate= or arrival_times=, not both (the rate would be "
                         f"ignored)")
    if arrival_times is not None and not (_same(arrival, "poisson") and _same(cv, 1.0)):
        raise ValueError(f"{name!r}: arrival= and cv= draw arrivals at rate=; arrival_times= "
                         f"gives them")
    cv_for(arrival, cv)


def load(name, *, n=None, rate=None, arrival="poisson", cv=1.0, arrival_times=None,
         max_context=None, seed=0, hash_block_tokens=None, random_input_len=None,
         random_output_len=None, random_range_ratio=None, random_prefix_len=None,
         sharegpt_output_len=None, burstiness=None, vllm_formula=None) -> pd.DataFrame:
    """Load a bundled trace (see :data:`TRACES`), a benchmark tool's generated workload
    (``vllm-random``, ``vllm-sharegpt``: :mod:`workloads.vllm_bench`) or a workload file, in
    the request schema.

    - ``n``: keep the first ``n`` requests (an integer >= 1). A replayed trace or a file with
      fewer rows is an error; a length-only set samples ``n`` rows with replacement when ``n``
      exceeds it (then ``attrs["resampled_from"]`` holds the set's size), else takes the
      first ``n``.
    - ``rate``: for traces with timestamps, time-scale to this mean rate; for length-only sets,
      the rate of the ``arrival`` process (``"poisson"`` or ``"gamma"`` with ``cv``), kept as
      ``attrs["arrival_rate"]``: time-scaling the result to ``R`` gives the arrivals drawn at
      ``R`` (:func:`workloads.scale_to_rate`).
    - ``arrival_times``: explicit arrival times for a length-only set (instead of ``rate``).
      ``arrival``, ``cv`` and ``arrival_times`` shape a length-only set's arrivals only: given
      for a trace or a file with its own arrival times, or beside each other where they would
      change nothing (``cv`` with Poisson arrivals, ``rate`` with ``arrival_times``), they are a
      ``ValueError``, never ignored.
    - ``max_context``: drop requests whose prompt + output exceed it (a model's context window).
    - ``seed`` (an int or a ``numpy.random.Generator``): draws a length-only set's arrivals
      and resampled rows, and a generated workload. Where it draws nothing (a replayed trace,
      a file, ``arrival_times=`` without resampling) a seed other than 0 is a ``UserWarning``
      saying so (as ``sim run --seed`` warns), never silently ignored.
    - ``hash_block_tokens``: the tokens each ``hash_ids`` entry stands for (the block size the
      ids were made with: Mooncake's 512), set as ``attrs["block_size"]``; CSV and JSONL files
      cannot carry it (see :func:`with_hash_block_tokens`).

    - ``random_*``, ``sharegpt_output_len``, ``burstiness``, ``vllm_formula`` (``"current"``
      or ``"legacy"``): a generated workload's own arguments, ``vllm bench serve``'s flags in
      snake case (``random_input_len`` is
      ``--random-input-len``); ``n`` is its ``--num-prompts`` and ``rate`` its
      ``--request-rate`` (default inf: all at t = 0). Given for another workload: an error.

    An empty result (``n`` < 1, everything dropped, a file without rows) is a ``ValueError``.
    """
    n, max_context = _num_requests(n), _max_context(max_context)
    bench = dict(zip(BENCH_ARGS, (random_input_len, random_output_len, random_range_ratio,
                                  random_prefix_len, sharegpt_output_len, burstiness,
                                  vllm_formula)))
    if isinstance(name, str) and name in BENCH_WORKLOADS:
        if arrival_times is not None or not (_same(arrival, "poisson") and _same(cv, 1.0)):
            raise ValueError(f"arrival=, cv= and arrival_times= do not shape {name!r}: it "
                             f"draws the tool's arrivals from rate= and burstiness=")
        df = _within_context(load_bench(name, n=n, rate=rate, seed=seed, **bench),
                             max_context, repr(name))
        return with_hash_block_tokens(df, hash_block_tokens, f"the {name!r} workload")
    given = [k for k, v in bench.items() if v is not None]
    if given:
        raise ValueError(f"{given[0]} applies to the {' and '.join(BENCH_WORKLOADS)} workloads, "
                         f"not {str(name)!r}")
    if isinstance(name, str) and name == AGENTIC_NAME:  # generated (workloads.agentic)
        return _within_context(load_agentic(n, rate, seed, hash_block_tokens, arrival, cv,
                                            arrival_times), max_context, repr(name))
    if not isinstance(name, (str, Path)):
        raise TypeError(f"workload must be a trace name or a file path, got {name!r}")
    if isinstance(name, str) and not name.strip():  # (Path('') is '.': "a folder", it said)
        raise _unknown_name(name)
    rng = _rng(seed)
    if name not in TRACES:
        path = Path(name)
        if path.suffix or path.exists():
            _replayed(str(path), arrival, cv, arrival_times)
            seed_unused(seed, f"the file {str(path)!r} is replayed as recorded")
            return load_file(path, n=n, rate=rate, max_context=max_context,
                             hash_block_tokens=hash_block_tokens)
        raise _unknown_name(name)
    df = _within_context(_read(name), max_context, repr(name))
    if "arrival_time" not in df.columns:
        _arrival_args(name, rate, arrival, cv, arrival_times)
        if n is not None and n > len(df):
            size = len(df)
            df = df.iloc[rng.integers(0, size, n)].reset_index(drop=True)
            df.attrs["resampled_from"] = size
        elif n is not None:
            df = df.iloc[:n].reset_index(drop=True)
        if arrival_times is not None:
            if "resampled_from" not in df.attrs:
                seed_unused(seed, f"{name!r} takes its first rows and arrival_times= gives "
                                  f"their arrivals")
            times = np.asarray(arrival_times, dtype=np.float64)
            if len(times) != len(df):
                raise ValueError(f"arrival_times has {len(times)} entries for {len(df)} requests")
        elif rate is None:
            raise ValueError(f"{name!r} has no arrival times: give rate= (requests/s) or "
                             f"arrival_times=")
        elif arrival == "poisson":
            times = poisson(len(df), rate, rng)
        elif arrival == "gamma":
            times = gamma(len(df), rate, cv, rng)
        else:
            raise ValueError(f"arrival must be 'poisson' or 'gamma', got {arrival!r}")
        df.insert(0, "arrival_time", times)
        if arrival_times is None:  # (drawn here: scale_to_rate uses the nominal rate)
            drawn_at(df, rate, 1.0 if arrival == "poisson" else cv)
    else:
        _replayed(f"the {name!r} trace", arrival, cv, arrival_times)
        seed_unused(seed, f"the {name!r} trace is replayed as recorded")
        df = _first(df, n, f"the {name!r} trace")
        if rate is not None:
            df = scale_to_rate(df, rate)
    df.attrs["name"] = name
    return with_hash_block_tokens(validate(df), hash_block_tokens, f"the {name!r} trace")


def with_hash_block_tokens(df, value, where="the workload") -> pd.DataFrame:
    """``df`` with ``attrs["block_size"]`` (tokens per ``hash_ids`` entry) set to ``value``, a
    positive integer (None: ``df`` unchanged). A workload without ``hash_ids``, or whose own
    ``attrs["block_size"]`` (a bundled trace, a parquet file) says otherwise, is a
    ``ValueError`` naming ``where``: the ids were made with one block size."""
    if value is None:
        return df
    from .prefix import _positive_int
    value = _positive_int("hash_block_tokens", value)
    if "hash_ids" not in df.columns:
        raise ValueError(f"hash_block_tokens {value} applies to a workload with hash_ids: "
                         f"{where} has no hash_ids column")
    own = df.attrs.get("block_size")
    if own is not None and own != value:
        raise ValueError(f"hash_block_tokens {value} contradicts {where}'s own {own} tokens "
                         f"per hash id (attrs['block_size']): give {own}, or none")
    df.attrs["block_size"] = value
    return df


# what a reader may raise on a file that is not what its suffix says (truncated, corrupt,
# wrong encoding, a folder): turned into one ValueError naming the file
_READ_ERRORS = (ValueError, TypeError, KeyError, IndexError, OSError, EOFError, UnicodeError,
                zlib.error, pd.errors.ParserError, pd.errors.EmptyDataError)


_AS_READ = {"num_prompt_tokens": object, "num_output_tokens": object}


def _read_file(path, suffix) -> pd.DataFrame:
    if suffix.startswith(".csv"):
        return pd.read_csv(path)
    if suffix.startswith(".json"):  # (counts as read: JSON's true is no 1; validate says so)
        try:
            df = pd.read_json(path, lines=suffix.startswith(".jsonl"), dtype=_AS_READ)
        except ValueError:
            if suffix.startswith(".jsonl"):  # pandas names a byte position: the line instead
                first_bad_line(path)
            raise
        if isinstance(df, pd.DataFrame) and df.empty and not len(df.columns):
            raise pd.errors.EmptyDataError
        return df
    import pyarrow
    try:
        return pd.read_parquet(path)
    except pyarrow.ArrowException as e:  # not all of them are ValueErrors
        raise ValueError(str(e)) from None


def _text_times(df, where) -> pd.DataFrame:
    """A CSV file's ``arrival_time`` written as ISO timestamps (``2023-11-16 18:15:46.680``, as
    ``save`` writes a datetime column) or durations (``0 days 00:00:01.5``) as datetimes or
    timedeltas, which ``validate`` turns into seconds, as it does a JSONL or parquet file's (a
    CSV's text was refused: such a workload saved as CSV did not load back). When row 0 is one
    of them, a row that is not is an error naming it; other text is left for ``validate``."""
    col = df.get("arrival_time")
    if col is None or not len(col) or not (pd.api.types.is_object_dtype(col)
                                           or pd.api.types.is_string_dtype(col)) \
            or pd.isna(col.iloc[0]) \
            or pd.notna(pd.to_numeric(col.iloc[0], errors="coerce")):  # numbers: seconds
        return df
    for parse, kind in ((lambda c, **kw: pd.to_datetime(c, format="ISO8601", **kw),
                         "timestamp"), (pd.to_timedelta, "duration")):
        try:
            parse(col.iloc[:1])
        except (ValueError, TypeError, OverflowError):
            continue
        times = parse(col, errors="coerce")
        bad = (times.isna() & col.notna()).to_numpy()
        if bad.any():
            i = int(bad.argmax())
            raise ValueError(f"{where}arrival_time: row {i} has {col.iloc[i]!r}, not a {kind} "
                             f"as row 0 ({col.iloc[0]!r})")
        df["arrival_time"] = times
        return df
    return df


def _hash_id_lists(df, where) -> pd.DataFrame:
    """``hash_ids``: a JSON list of integers per row (CSV), a list (JSONL, parquet), or empty."""
    out = []
    for i, x in enumerate(df["hash_ids"].tolist()):
        if isinstance(x, str):
            try:
                x = json.loads(x)
            except ValueError:
                raise ValueError(f"{where}hash_ids: row {i} has {x[:40]!r}, not a JSON list of "
                                 f"integers") from None
        elif x is not None and not isinstance(x, float):  # NaN: no ids
            x = list(x) if hasattr(x, "__iter__") else x
        if isinstance(x, float) and x != x:
            x = None
        if x is not None and not (isinstance(x, list) and all(
                isinstance(h, (int, np.integer)) and not isinstance(h, bool) for h in x)):
            raise ValueError(f"{where}hash_ids: row {i} has {x!r}, not a list of integers")
        out.append(x)
    df["hash_ids"] = out
    return df


def load_file(path, *, n=None, rate=None, max_context=None,
              hash_block_tokens=None) -> pd.DataFrame:
    """A CSV, JSONL or parquet file in the request schema (``.gz`` allowed for CSV and JSONL);
    ``hash_block_tokens``: the tokens per ``hash_ids`` entry (:func:`with_hash_block_tokens`),
    which a CSV or JSONL file cannot hold.

    Every row is checked; errors name the file and the line of a CSV or JSONL file (the header
    is line 1 of a CSV: :mod:`workloads.lines`), the row of a parquet one (0-based). A file
    that cannot be read in its format, or has no rows, is a ``ValueError`` naming the file;
    ``n`` larger than the file is an error (see :func:`load`)."""
    n, max_context = _num_requests(n), _max_context(max_context)
    path = Path(path)
    where = f"{path}: "
    if not path.exists():
        raise ValueError(f"workload file {str(path)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"workload file {str(path)!r} is a folder")
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    if not (suffix.startswith(".csv") or suffix.startswith(".json") or suffix == ".parquet"):
        raise ValueError(f"workload file {str(path)!r}: unknown format {suffix!r} "
                         f"(use .csv, .jsonl or .parquet)")
    try:
        df = _read_file(path, suffix)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{where}the file is empty (no header, no rows): nothing to "
                         f"simulate") from None
    except _READ_ERRORS as e:
        kind = suffix.lstrip(".").split(".")[0].upper()
        detail = " ".join(str(e).split())[:200] or type(e).__name__
        raise ValueError(f"{where}cannot be read as {kind}: {detail}") from None
    if not isinstance(df, pd.DataFrame):  # e.g. a JSON file holding one scalar
        raise ValueError(f"{where}does not hold a table of requests")
    df.columns = [str(c) for c in df.columns]
    try:
        if suffix.startswith(".csv"):
            df = _text_times(df, where)
        elif suffix.startswith(".json"):  # (a JSON true read as 1 s: said by line, column)
            check_json_booleans(path, suffix, where)
        if "hash_ids" in df.columns:
            df = _hash_id_lists(df, where)
        df = validate(df.reset_index(drop=True), source=str(path))
        df = with_hash_block_tokens(df, hash_block_tokens, str(path))  # (rows as in the file)
        check_hash_id_counts(df, df.attrs.get("block_size"), where)
    except ValueError as e:  # "row i" of the DataFrame: "line N" of the file
        raise ValueError(as_lines(str(e), path, suffix)) from None
    for key in (RATE_KEY, CV_KEY):  # (a parquet file keeps a drawn workload's attrs, a CSV
        df.attrs.pop(key, None)  # one cannot: every file is a trace, scaled by its own rate)
    df = _within_context(df, max_context, str(path))
    df = _first(df, n, str(path))
    if rate is not None:
        df = scale_to_rate(df, rate)
    df.attrs.setdefault("name", path.name)
    return df


def save(df: pd.DataFrame, path) -> Path:
    """Write a workload as CSV, JSONL or parquet (by suffix)."""
    path = Path(path)
    if path.suffix == ".parquet":
        df.to_parquet(path, index=False)
    elif path.suffix == ".jsonl":
        df.to_json(path, orient="records", lines=True)
    elif path.suffix == ".csv":
        out = df.copy()
        if "hash_ids" in out.columns:
            out["hash_ids"] = [_json_ids(x) for x in out["hash_ids"]]
        out.to_csv(path, index=False)
    else:
        raise ValueError(f"unknown workload format {path.suffix!r} (use .csv, .jsonl or .parquet)")
    return path


def _json_ids(ids) -> str:
    """One row's ``hash_ids`` as CSV text: a JSON list (NumPy integers, as a parquet file's
    arrays hold, written as plain ints), or empty for a row without ids (read back as none)."""
    if ids is None or ids is pd.NA or isinstance(ids, float) and ids != ids:
        return ""
    return json.dumps(np.asarray(ids).tolist() if isinstance(ids, np.ndarray) else
                      [h.item() if isinstance(h, np.generic) else h for h in ids])
