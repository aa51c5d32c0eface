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

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from .arrivals import _rng, gamma, poisson, scale_to_rate
from .schema import validate

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
    return list(TRACES)


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
        else:
            raw = pd.read_csv(f, compression="gzip")
            df = pd.DataFrame({"num_prompt_tokens": raw["num_prefill_tokens"].to_numpy(),
                               "num_output_tokens": raw["num_decode_tokens"].to_numpy()})
    df.attrs["name"] = name
    return df


def load(name, *, n=None, rate=None, arrival="poisson", cv=1.0, arrival_times=None,
         max_context=None, seed=0) -> pd.DataFrame:
    """Load a bundled trace (see :data:`TRACES`) or a workload file, in the request schema.

    - ``n``: keep the first ``n`` requests (length-only sets: sample ``n`` rows with replacement
      when ``n`` exceeds the set, else take the first ``n``).
    - ``rate``: for traces with timestamps, time-scale to this mean rate; for length-only sets,
      the rate of the ``arrival`` process (``"poisson"`` or ``"gamma"`` with ``cv``).
    - ``arrival_times``: explicit arrival times for a length-only set.
    - ``max_context``: drop requests whose prompt + output exceed it (a model's context window).
    """
    rng = _rng(seed)
    if name not in TRACES:
        path = Path(name)
        if path.suffix or path.exists():
            return load_file(path, n=n, rate=rate, max_context=max_context)
        raise ValueError(f"workload {name!r} is neither a bundled trace {trace_names()} nor a file")
    df = _read(name)
    if max_context is not None:
        keep = (df["num_prompt_tokens"] + df["num_output_tokens"]) <= int(max_context)
        df = df[keep.to_numpy()].reset_index(drop=True)
    if "arrival_time" not in df.columns:
        if n is not None and n > len(df):
            df = df.iloc[rng.integers(0, len(df), n)].reset_index(drop=True)
        elif n is not None:
            df = df.iloc[:n].reset_index(drop=True)
        if arrival_times is not None:
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
    else:
        if n is not None:
            df = df.iloc[:n].reset_index(drop=True)
        if rate is not None:
            df = scale_to_rate(df, rate)
    df.attrs["name"] = name
    return validate(df)


def load_file(path, *, n=None, rate=None, max_context=None) -> pd.DataFrame:
    """A CSV, JSONL or parquet file in the request schema; errors name the file and the row."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"workload file {str(path)!r} does not exist")
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    if suffix.startswith(".csv"):
        df = pd.read_csv(path)
        if "hash_ids" in df.columns:
            df["hash_ids"] = [json.loads(x) if isinstance(x, str) else x for x in df["hash_ids"]]
    elif suffix.startswith(".jsonl") or suffix.startswith(".json"):
        df = pd.read_json(path, lines=suffix.startswith(".jsonl"))
    elif suffix == ".parquet":
        df = pd.read_parquet(path)
        if "hash_ids" in df.columns:
            df["hash_ids"] = [list(x) if x is not None else None for x in df["hash_ids"]]
    else:
        raise ValueError(f"workload file {str(path)!r}: unknown format {suffix!r} "
                         f"(use .csv, .jsonl or .parquet)")
    if max_context is not None:
        df = df[(df["num_prompt_tokens"] + df["num_output_tokens"]) <= int(max_context)]
    if n is not None:
        df = df.iloc[:n]
    df = validate(df.reset_index(drop=True), source=str(path))
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
            out["hash_ids"] = [json.dumps(list(x)) for x in out["hash_ids"]]
        out.to_csv(path, index=False)
    else:
        raise ValueError(f"unknown workload format {path.suffix!r} (use .csv, .jsonl or .parquet)")
    return path
