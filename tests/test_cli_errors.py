"""Every user error of the ``sim`` command: one line on stderr, ``sim <command>: error: ...``,
exit status 2, no traceback, nothing simulated or written (``--debug`` shows the traceback)."""

import subprocess
import sys
from pathlib import Path

import pytest

import sim.engine
from sim.cli import main
from sim.cli.table import toml_keys

HEADER = "arrival_time,num_prompt_tokens,num_output_tokens\n"
TOML5 = 'workload = "azure-code"\nnum_requests = 5\n'
FILES = {  # name -> contents, written into the test's folder
    "header_only.csv": HEADER,
    "zero_bytes.csv": "",
    "negative.csv": HEADER + "0,5,5\n1,-200,5\n",
    "broken.toml": "workload = [\n",
    "n_string.toml": 'workload = "azure-code"\nnum_requests = "100"\n',
    "plots_no.toml": 'workload = "azure-code"\nnum_requests = 5\nplots = "no"\n',
    "lora_rank.toml": 'enable_lora = true\nmax_lora_rank = 12\n',
    "offload.toml": 'offload_gb = 2\n',
    "lora_false.toml": 'workload = "azure-code"\nnum_requests = 5\nenable_lora = "false"\n',
    "slo_int.toml": 'workload = "azure-code"\nnum_requests = 5\nslo = 2\n',
    "slo_unknown.toml": 'workload = "azure-code"\nnum_requests = 5\n[slo]\nttfb = 1.0\n',
    "slo_negative.toml": 'workload = "azure-code"\nnum_requests = 5\n[slo]\nttft = -1.0\n',
    "cost_int.toml": 'workload = "azure-code"\nnum_requests = 5\ncost = 3\n',
    "misspelt.toml": 'shceduler = "static"\n',
    "think.toml": 'workload = "azure-code"\nnum_requests = 5\nthink_time = 2.0\n',
    "link.toml": TOML5 + "link_latency_s = 0.1\n",
    "closed_rates.toml": TOML5 + "closed_loop_users = 4\n[grid]\nrate = [1.0, 8.0]\n",
    "goodput_no_slo.toml": TOML5 + 'metrics = ["goodput"]\n[grid]\nmax_batch_size = [4]\n',
    "transfer_no_pools.toml": TOML5 + 'metrics = ["kv_transfer_time_p99"]\n[grid]\n'
                                      'max_batch_size = [4]\n',
    "think_file.toml": TOML5 + "think_time = 1.0\n",
    "c6.toml": TOML5 + "replicas = 2\nprefill_replicas = 1\n",
    "linear_abc.toml": TOML5 + 'cost = "linear:abc"\n',
    "static_chunk.toml": TOML5 + 'scheduler = "static"\nchunk_size = 100\n',
    "tree.toml": TOML5 + 'prefix_caching = "tree"\n',
    "spec_both.toml": TOML5 + "[speculative]\nnum_speculative_tokens = 2\nacceptance_rate = 0.5\n"
                              "acceptance_lengths = [0.5, 0.3, 0.2]\ndraft_cost_ratio = 0.1\n",
    "spec_no_k.toml": TOML5 + "[speculative]\nacceptance_rate = 0.5\n",
    "spec_empty.toml": TOML5 + "[speculative]\n",
    "hashes.csv": HEADER.replace("\n", ",hash_ids\n") + '0,5,5,"[1]"\n',
    "list.json": "[]",
    "not_json.json": "{nope",
    "a_file": "not a folder",
    "router.toml": TOML5 + 'router = "random"\n',
    "profile_cost.toml": TOML5 + 'cost = "constant:0.01"\nprofile = "p.json"\n',
    "one_row.csv": HEADER + "0,5,5\n",
    "long_hashes.csv": HEADER.replace("\n", ",hash_ids\n") + '0,16,5,"[1]"\n0,17,5,"[1, 2, 3]"\n',
    "hash_tokens.toml": TOML5 + 'hash_block_tokens = "512"\n',
    "same_time.csv": HEADER + "2.5,5,5\n2.5,6,6\n",
    "max_len.toml": TOML5 + "max_model_len = 1024.5\n",
    "trt_fraction.toml": TOML5 + 'scheduler = "tensorrt-llm"\nfree_gpu_memory_fraction = "0.8"\n',
    "trt_pool.toml": TOML5 + 'scheduler = "tensorrt-llm"\nfree_gpu_memory_fraction = 0.8\n'
                             'kv_blocks = 100\n',
    "trt_chunked.toml": TOML5 + 'scheduler = "tensorrt-llm"\nenable_chunked_context = "yes"\n',
    "chunked_no.toml": TOML5 + 'enable_chunked_context = "no"\n',
    "trt_policy.toml": TOML5 + 'scheduler = "tensorrt-llm"\ncapacity_scheduler_policy = "FCFS"\n',
}
RUN = ["run", "-w", "azure-code", "-n", "5", "--cost", "constant:0.01", "--no-plots"]

# (arguments, the message's expected fragment); ``{d}`` is the test's folder
CASES = [
    (RUN + ["-n", "-5"], "--num-requests must be >= 1, got -5"),  # (as -n 0 says it)
    (RUN + ["-n", "0"], "--num-requests must be >= 1, got 0: an empty workload has nothing"),
    (RUN + ["-w", "{d}/header_only.csv"], "header_only.csv: workload has no requests"),
    (RUN + ["-w", "{d}/zero_bytes.csv"], "zero_bytes.csv: the file is empty"),
    (RUN + ["-w", "{d}/negative.csv"], "negative.csv: num_prompt_tokens: line 3 has -200 ("),
    (RUN + ["-w", "azure-cod"], "did you mean 'azure-code'?"),
    (RUN + ["-w", "mooncake-conversation", "-s", "sglang", "--block-size", "7"],
     "--block-size 7 does not divide the workload's 512 tokens per hash id"),
    (RUN + ["-w", "{d}/hashes.csv", "-n", "1", "-s", "vllm"], "the workload has hash_ids but no "
     "attrs['block_size'] (tokens per hash id): load it with hash_block_tokens=N (sim run "
     "--hash-block-tokens N; Mooncake's ids are 512 tokens)"),
    (RUN + ["-w", "{d}/hashes.csv", "--hash-block-tokens", "0"],
     "--hash-block-tokens must be > 0, got 0"),
    (RUN + ["--hash-block-tokens", "16"], "--hash-block-tokens 16 applies to a workload with "
     "hash_ids: the 'azure-code' trace has no hash_ids column"),
    (RUN + ["-w", "mooncake-conversation", "--hash-block-tokens", "16"], "--hash-block-tokens 16 "
     "contradicts the 'mooncake-conversation' trace's own 512 tokens per hash id"),
    (RUN + ["-w", "{d}/long_hashes.csv", "--hash-block-tokens", "16"], "long_hashes.csv: "
     "hash_ids: line 3 has 3 ids for its 17 prompt tokens: at 16 tokens per hash id at most 2"),
    (["run", "{d}/hash_tokens.toml"], "hash_tokens.toml: hash_block_tokens must be an integer, "
     "got '512'"),
    (["workload", "describe", "{d}/one_row.csv", "--hash-block-tokens", "512"],
     "--hash-block-tokens 512 applies to a workload with hash_ids: {d}/one_row.csv has no"),
    (["run", "{d}/broken.toml"], "broken.toml: not a valid TOML file"),
    (["run", "{d}/missing.toml"], "config file '{d}/missing.toml' does not exist"),
    (["run", "{d}/misspelt.toml"], "unknown setting(s) ['shceduler'] (did you mean 'scheduler'?)"),
    (["run", "{d}/n_string.toml"], "n_string.toml: num_requests must be an integer, got '100'"),
    (["run", "{d}/plots_no.toml"], "plots_no.toml: plots must be true or false, got 'no'"),
    (["run", "{d}/lora_false.toml"],  # a string, not a TOML bool: never read as on
     "lora_false.toml: enable_lora must be true or false, got 'false'"),
    (["run", "{d}/slo_int.toml"], "slo_int.toml: slo must be a table of limits in seconds"),
    (["run", "{d}/slo_unknown.toml"], "slo_unknown.toml: slo: unknown SLO(s) ['ttfb']"),
    (["run", "{d}/slo_negative.toml"], "slo_negative.toml: slo.ttft must be a finite number > 0"),
    (["run", "{d}/cost_int.toml"], "cost_int.toml: cost must be roofline, constant:SECONDS or"),
    (["run", "{d}/think.toml"], "think.toml: think_time applies to a closed loop only"),
    (RUN + ["--closed-loop", "0"], "--closed-loop must be > 0, got 0"),
    (RUN + ["--think-time", "3"], "--think-time applies to a closed loop only: give --closed-loop"),
    (RUN + ["--closed-loop", "2", "--think-time", "-1"], "--think-time must be a finite number >= 0"),
    (RUN + ["--slo-ttft", "-1"], "--slo-ttft must be a finite number > 0, got -1.0"),
    (RUN + ["--rate", "0"], "--rate must be a finite number > 0, got 0.0"),
    (RUN + ["--model", ""], "--model must be a preset name, got ''"),
    (RUN + ["--gpu", " "], "--gpu must be a preset name, got ' '"),
    (RUN + ["--seed", "-1"], "--seed must be >= 0, got -1"),
    (RUN + ["--cost", "linear:"], "--cost 'linear:': four numbers expected (BASE,PREFILL,"),
    (RUN + ["--cost", "linear:1"], "--cost 'linear:1': four numbers expected (BASE,PREFILL,DECODE,"
                                   "CONTEXT: seconds, and seconds per prefill, decode and context "
                                   "token; write 0 for a term not wanted), got 1"),
    (RUN + ["--cost", "linear:1,2,3,4,5"], "--cost 'linear:1,2,3,4,5': four numbers expected"),
    (RUN + ["--cost", "cubic:1"], "--cost 'cubic:1': use roofline, constant:SECONDS or"),
    (RUN + ["--engine-overheads", "fitted"], "--engine-overheads 'fitted': scheduler 'chunked' "
                                             "has no fitted overheads (fitted: sglang, vllm)"),
    (RUN + ["--engine-overheads", "1,2,3"], "--engine-overheads must be none, fitted, auto or "
                                            "REQUEST_MS,ITER_US,SEQ_US,sync|overlap[,NAME=VALUE...], "
                                            "got '1,2,3'"),
    (RUN + ["--bands", "1.5"], "--bands must be a central probability in (0, 1), e.g. 0.9, got "
                               "1.5"),
    # the error lists every key the command reads, sorted (the table's: hand-kept copies of the
    # whole list conflicted on every new setting), and the core keys are among them
    (["run", "{d}/misspelt.toml"], f"known: {sorted(toml_keys('run'))}"),
    (["sweep", "{d}/misspelt.toml"], f"known: {sorted(toml_keys('sweep'))}"),
    (["run", "{d}/misspelt.toml"], "'replicas', 'report', 'request_path', 'router', "
                                   "'scheduler', 'seed', "),
    (["run", "{d}/misspelt.toml"], "'tensor_parallel', 'think_time', 'token_budget', "),
    (["sweep", "{d}/misspelt.toml"], "'gpu', 'gpu_idle_watts', 'gpu_max_watts', "
                                     "'gpu_memory_utilization', 'grid', "),
    (["sweep", "{d}/misspelt.toml"], "'metrics', 'model', 'num_requests', "),
    (RUN + ["--cost", "constant:x"], "--cost 'constant:x': numbers expected after ':'"),
    (RUN + ["--cost", "constant:-1"], "--cost 'constant:-1': seconds must be"),
    # a setting is named as the user wrote it: the file's key, or the flag
    (["run", "{d}/link.toml"], "link.toml: link_latency_s applies to disaggregation only: give "
                               "prefill_replicas and/or decode_replicas"),
    (["run", "{d}/link.toml", "--decode-replicas", "0"], "--decode-replicas must be > 0"),
    (RUN + ["--link-latency", "0.1"], "--link-latency applies to disaggregation only: give "
                                      "--prefill-replicas and/or --decode-replicas"),
    (["run", "{d}/think_file.toml"], "think_file.toml: think_time applies to a closed loop "
                                     "only: give closed_loop_users = USERS as well"),
    (["run", "{d}/c6.toml"], "error: {d}/c6.toml: replicas and prefill_replicas exclude each "
                             "other"),
    (["run", "{d}/c6.toml", "--replicas", "3"], "--replicas and {d}/c6.toml: prefill_replicas "
                                                "exclude"),
    (RUN + ["--replicas", "2", "--prefill-replicas", "1"], "--replicas and --prefill-replicas "
                                                           "exclude each other"),
    (["run", "{d}/linear_abc.toml"], "linear_abc.toml: cost 'linear:abc': numbers expected"),
    (RUN + ["-s", "static", "--chunk-size", "100"], "error: --chunk-size 100 is not used by the "
                                                    "'static' scheduler"),
    (["run", "{d}/static_chunk.toml"], "static_chunk.toml: chunk_size 100 is not used by the "
                                       "'static' scheduler"),
    (["run", "{d}/tree.toml"], "tree.toml: prefix_caching must be one of (False, 'block', 'radix') or 'off', got 'tree'"),
    (["run", "{d}/spec_both.toml"], "spec_both.toml: [speculative] give acceptance_rate or "
                                    "acceptance_lengths, not both"),
    (["run", "{d}/spec_no_k.toml"], "spec_no_k.toml: [speculative] needs num_speculative_tokens"),
    (["run", "{d}/spec_empty.toml"], "spec_empty.toml: [speculative] is empty: give "
                                     "num_speculative_tokens and the draft's cost"),
    (RUN + ["--spec-tokens", "2", "--spec-method", "ngram", "--draft-cost-ratio", "0.1"],
     "--draft-cost-ratio is given but --spec-method ngram (prompt lookup) has no draft model"),
    (RUN + ["--spec-tokens", "2", "--draft-model", "tinyllama-1.1b", "--draft-cost-ratio", "0.1"],
     "--draft-model and --draft-cost-ratio are both given"),
    (RUN[:-3] + ["--profile", "{d}/nope.json"], "--profile '{d}/nope.json': no such file"),
    (RUN[:-3] + ["--profile", "{d}/list.json"], "--profile '{d}/list.json': not a calibration "
                                                "profile"),
    # RUN gives --cost: with a profile it was ignored, silently (the profile won)
    (RUN + ["--profile", "{d}/list.json"], "error: --cost and --profile exclude each other: a "
                                           "calibration profile prices every step"),
    (["run", "{d}/profile_cost.toml"], "profile_cost.toml: cost and profile exclude each other"),
    (RUN + ["-o", "{d}/a_file/out"], "--output '{d}/a_file/out': cannot write there"),
    (RUN + ["-o", "{d}/a_file"], "--output '{d}/a_file': cannot write there"),
    (RUN + ["-s", "chnked"], "argument --scheduler/-s: invalid choice: 'chnked'"),
    (RUN + ["-n", "ten"], "argument --num-requests/-n/--num-prompts: invalid int value: 'ten'"),
    # max_model_len: a positive integer, at most the model's context length (vLLM refuses more)
    (RUN + ["--max-model-len", "0"], "error: --max-model-len must be > 0, got 0"),
    (RUN + ["--max-model-len", "4k"], "argument --max-model-len: invalid int value: '4k'"),
    (["run", "{d}/max_len.toml"], "max_len.toml: max_model_len must be an integer, got 1024.5"),
    (RUN + ["--model", "llama-2-7b", "--max-model-len", "4097"], "error: --max-model-len 4,097 "
     "is more than the context length of model 'llama-2-7b', 4,096 tokens"),
    (["calibrate", "--budget", "-5"], "argument --budget: must be > 0, got -5"),
    (["calibrate", "-o", "{d}/a_file/p.json"], "--output '{d}/a_file/p.json': cannot write there"),
    (["validate", "--profile", "{d}/nope.json"], "--profile '{d}/nope.json': no such file"),
    (["validate", "--profile", "{d}/not_json.json"], "not_json.json': not a JSON file"),
    (["validate", "-n", "0"], "argument --requests/-n: must be > 0, got 0"),
    (["workload", "describe"], "describe needs a bundled trace name or a file"),
    # sim run's row of the table: the same check and message as sim run's -n 0
    (["workload", "describe", "azure-code", "-n", "0"], "error: --num-requests must be >= 1, got "
                                                        "0: an empty workload has nothing"),
    (["workload", "describe", "azure-code", "--seed", "-1"], "error: --seed must be >= 0, got -1"),
    (["workload", "describe", "nope"], "workload 'nope' is neither a bundled trace nor a file"),
    # the loader's arguments (rate=, n=) named as the flags
    (["workload", "describe", "sharegpt"], "'sharegpt' has no arrival times: give --rate "
                                           "REQ_PER_S"),
    (["workload", "describe", "azure-code", "-n", "10000000"], "error: --num-requests "
     "10,000,000 is more than the 8,819 requests of the 'azure-code' trace; omit --num-requests"),
    # --plot checked before the workload is read and described
    (["workload", "describe", "azure-code", "--plot", "w.txt"], "--plot 'w.txt' must be a file "
                                                               "name ending in .png"),
    (["workload", "describe", "azure-code", "--plot", "{d}/a_file/w.png"],
     "--plot '{d}/a_file/w.png': cannot write there"),
    # --rate time-scales a replay: it needs two requests apart in time
    (["run", "-w", "{d}/one_row.csv", "--rate", "5"], "error: --rate 5 cannot time-scale a "
                                                      "workload of 1 request"),
    (["run", "-w", "{d}/same_time.csv", "--rate", "5"], "error: --rate 5 cannot time-scale a "
     "workload of 2 requests all arriving at 2.5 s: its mean rate needs at least two requests "
     "spread over time (omit the rate to replay it as it is)"),
    # a router routes among several replicas: set for one, it would be silently ignored
    (RUN + ["--router", "least_kv"], "error: --router 'least_kv' applies to several replicas "
                                     "only: give --replicas N (N >= 2) or prefill and decode "
                                     "pools"),
    (["run", "{d}/router.toml"], "router.toml: router 'random' applies to several replicas "
                                 "only: give replicas = N (N >= 2)"),
    # a metric no point can have was found missing only after every point had run
    (["sweep", "{d}/goodput_no_slo.toml"], "goodput_no_slo.toml: metrics: 'goodput' is in the "
                                           "summary of a run with an [slo] table only"),
    (["sweep", "{d}/transfer_no_pools.toml"], "metrics: 'kv_transfer_time_p99' is in the summary "
                                              "of a run with prefill_replicas and "
                                              "decode_replicas only; this sweep has none"),
    # a rate grid beside a closed loop gave identical rows (the users ignore the rate)
    (["sweep", "{d}/closed_rates.toml"], "closed_rates.toml: grid point rate=1.0: rate "
                                         "applies to an open loop; with closed_loop="),
    (["capacity", "-w", "azure-code", "-n", "5", "--slo-ttft", "1", "--router", "random"],
     "error: --router 'random' applies to several replicas only"),
    # a closed loop has no rate to search (the library's message named config.closed_loop);
    # the fractions were checked only by the library, without their flags
    (["capacity", "-w", "azure-code", "-n", "5", "--slo-ttft", "1", "--closed-loop", "4"],
     "error: --closed-loop 4: sim capacity time-scales an open loop's arrivals"),
    (["run", "-w", "vllm-random", "-n", "5", "--request-rate", "inf"],  # vllm's default
     "--rate must be a finite number > 0, got inf: omit it to send a vllm-random"),
    (["capacity", "-w", "vllm-random", "-n", "5", "--slo-ttft", "1", "--max-concurrency", "4"],
     "error: --max-concurrency 4: sim capacity time-scales an open loop's arrivals"),
    (["capacity", "-w", "azure-code", "-n", "5", "--slo-ttft", "1", "--think-time", "2"],
     "error: --think-time is not used by sim capacity: it time-scales an open loop's arrivals"),
    # sim run's output flags were accepted and ignored: nothing written, --quiet printed all
    (["capacity", "-w", "azure-code", "-n", "5", "--slo-ttft", "1", "--plots"],
     "error: --plots is not used by sim capacity: it prints the highest rate and the rates "
     "tried, and writes no file"),
    (["capacity", "-w", "azure-code", "-n", "5", "--slo-ttft", "1", "-o", "out"],
     "error: --output is not used by sim capacity"),
    (["capacity", "-w", "azure-code", "-n", "5", "--slo-ttft", "1", "-q"],
     "error: --quiet is not used by sim capacity"),
    (["capacity", "-w", "azure-code", "-n", "5", "--slo-ttft", "1", "--attainment", "1.5"],
     "error: --attainment 1.5 must be at most 1 (a fraction)"),
    (["capacity", "-w", "azure-code", "-n", "5", "--slo-ttft", "1", "--tol", "1"],
     "error: --tol 1 must be below 1 (a fraction)"),
    (RUN + ["-n", "10000000"], "--num-requests 10,000,000 is more than the 8,819 requests of "
                               "the 'azure-code' trace; omit --num-requests to take all"),
    (["memory", "llama-3.1-8b", "--gpu-memory-gb", "0"], "--gpu-memory-gb must be a finite "
                                                         "number > 0, got 0.0"),
    (["memory", "llama-3.1-8b", "--utilization", "1.5"], "--utilization must be at most 1"),
    (["memory", "llama-3.1-8b", "--tp", "0"], "--tp must be > 0, got 0"),
    (["memory", "llama-3.1-8b", "--tp", "3"], "--tp 3 must divide or be a multiple of "
                                               "num_key_value_heads 8"),
    # an engine's memory knob given for the other engine's accounting was silently ignored
    (["memory", "llama-3.1-8b", "--mem-fraction-static", "0.5"], "error: --mem-fraction-static "
     "is not used by --accounting vllm (its knobs: --utilization, --max-num-batched-tokens, "
     "--max-num-seqs)"),
    (["memory", "llama-3.1-8b", "--accounting", "sglang", "--utilization", "0.8"],
     "error: --utilization is not used by --accounting sglang (its knobs: --mem-fraction-static)"),
    (["memory", "llama-3.1-8b", "--accounting", "sglang", "--max-num-seqs", "4"],
     "error: --max-num-seqs is not used by --accounting sglang"),
    (["memory", "llama-3.1-8b", "--max-num-seqs", "0"], "--max-num-seqs must be > 0, got 0"),
    (["memory", "llama-3.1-8b", "--accounting", "sglang", "--mem-fraction-static", "2"],
     "--mem-fraction-static must be at most 1, got 2.0"),
    (["memory", "llama-3.1-8b", "--free-gpu-memory-fraction", "0.5"], "error: "
     "--free-gpu-memory-fraction is not used by --accounting vllm"),
    (["memory", "llama-3.1-8b", "--accounting", "tensorrt-llm", "--utilization", "0.8"],
     "error: --utilization is not used by --accounting tensorrt-llm (its knobs: "
     "--max-num-batched-tokens, --free-gpu-memory-fraction)"),
    (["memory", "llama-3.1-8b", "--accounting", "tensorrt-llm", "--mem-fraction-static", "0.8"],
     "error: --mem-fraction-static is not used by --accounting tensorrt-llm"),
    (["memory", "llama-3.1-8b", "--accounting", "tensorrt-llm",
      "--free-gpu-memory-fraction", "1"],
     "--free-gpu-memory-fraction must be below 1 (TensorRT-LLM refuses 1.0), got 1.0"),
    # sim run's flag: the same check as sim memory's, and only for the preset that reads it
    (RUN + ["-s", "tensorrt-llm", "--free-gpu-memory-fraction", "1"],
     "--free-gpu-memory-fraction must be below 1 (TensorRT-LLM refuses 1.0), got 1.0"),
    (RUN + ["-s", "vllm", "--free-gpu-memory-fraction", "0.8"],
     "error: --free-gpu-memory-fraction 0.8 is read only by the tensorrt-llm memory accounting, "
     "but the 'vllm' scheduler sizes its KV pool with vllm's (sim memory --accounting vllm "
     "shows its terms)"),
    (RUN + ["--free-gpu-memory-fraction", "0.8"],
     "--free-gpu-memory-fraction 0.8 is read only by the tensorrt-llm memory accounting, but "
     "the 'chunked' scheduler"),
    (RUN + ["-s", "tensorrt-llm", "--free-gpu-memory-fraction", "0.8", "--kv-blocks", "100"],
     "--free-gpu-memory-fraction 0.8 sizes the KV pool, which --kv-blocks 100 gives"),
    (RUN + ["--gpu-memory-utilization", "0.8", "--kv-blocks", "100"],
     "--gpu-memory-utilization 0.8 sizes the KV pool, which --kv-blocks 100 gives: set one"),
    (RUN + ["-s", "sglang", "--gpu-memory-utilization", "0.8"],
     "--gpu-memory-utilization 0.8 is vLLM's setting: the 'sglang' scheduler sizes its KV pool "
     "with sglang's accounting"),
    (RUN + ["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be at most 1, "
     "got 1.5"),
    (["run", "{d}/trt_pool.toml"],  # a second setting in the file's voice too
     "trt_pool.toml: free_gpu_memory_fraction 0.8 sizes the KV pool, which kv_blocks = 100 "
     "gives"),
    (["run", "{d}/trt_fraction.toml"],
     "trt_fraction.toml: free_gpu_memory_fraction must be a number, got '0.8'"),
    (RUN + ["-s", "sglang", "--enable-chunked-context"],
     "--enable-chunked-context True is not used by the 'sglang' scheduler"),
    (["run", "{d}/trt_chunked.toml"],
     "trt_chunked.toml: enable_chunked_context must be true or false, got 'yes'"),
    # a wrong type first, on any scheduler (newcomer review: chunked said "not used by")
    (["run", "{d}/chunked_no.toml"],
     "chunked_no.toml: enable_chunked_context must be true or false, got 'no'"),
    (RUN + ["-s", "tensorrt-llm", "--context-chunking-policy", "equal_progress"],
     "--context-chunking-policy 'equal_progress' chooses how prompts are cut: it needs "
     "--enable-chunked-context True"),
    (RUN + ["-s", "vllm", "--capacity-scheduler-policy", "max_utilization"],
     "--capacity-scheduler-policy 'max_utilization' is not used by the 'vllm' scheduler"),
    (RUN + ["-s", "tensorrt-llm", "--capacity-scheduler-policy", "fcfs"],
     "argument --capacity-scheduler-policy: invalid choice: 'fcfs'"),
    # a flag the command lacks: named by that command, whose --help lists what it takes
    (["compare", "{d}/x.json", "--rate", "3"],
     "unrecognized arguments: --rate 3 (see 'sim compare --help')"),
    (["memory", "llama-3.1-8b", "--ep", "2"],
     "unrecognized arguments: --ep 2 (see 'sim memory --help')"),
    (["run", "{d}/trt_policy.toml"],
     "trt_policy.toml: capacity_scheduler_policy must be one of ('guaranteed_no_evict', "
     "'max_utilization'), got 'fcfs'"),
    (RUN + ["--max-loras", "2"], "--max-loras needs enable_lora (--enable-lora)"),
    (RUN + ["--enable-lora", "--max-lora-rank", "24"], "--max-lora-rank must be one of (8, 16, "),
    (["run", "{d}/lora_rank.toml"], "lora_rank.toml: max_lora_rank must be one of (8, 16, 32, "
     "64, 128, 256, 320, 512) (vLLM's), got 12"),
    (RUN + ["--enable-lora", "--max-loras", "2", "--max-cpu-loras", "1"],
     "max_cpu_loras (1) must be >= max_loras (2)"),
    (RUN + ["--lora-zipf", "1"], "needs lora_adapters (--lora-adapters)"),
    # an offload tier without a prefix cache: found before the run, in the user's words
    (RUN + ["--offload-gb", "10"], "--offload-gb 10 needs --prefix-caching 'block' or 'radix' "
     "(the offload tier sits under the prefix cache), got the 'chunked' scheduler's default: "
     "off"),
    (["run", "{d}/offload.toml"], "offload.toml: offload_gb 2 needs prefix_caching = 'block'"),
]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """The test's folder, with ``FILES`` in it, as the working folder (the default output
    ``sim-out`` lands there: a failed run must not even create it)."""
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def sim_cli(argv, capsys):
    """(exit status, stdout, stderr) of ``sim argv`` run in this process."""
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def no_simulation(monkeypatch):
    """Fail if a command gets as far as simulating or calibrating."""
    def refuse(*args, **kwargs):
        raise AssertionError("the bad input was found only after the work started")
    from sim.tools import calibration, capacity  # (capacity binds run when imported)
    monkeypatch.setattr(sim.engine, "run", refuse)
    monkeypatch.setattr(capacity, "run", refuse)
    monkeypatch.setattr(calibration, "calibrate", refuse)


@pytest.mark.parametrize("argv, message", CASES, ids=[" ".join(a[len(RUN) if a[:len(RUN)] == RUN
                                                                  else 0:]) for a, _ in CASES])
def test_user_error_is_one_line_and_exit_status_2(argv, message, folder, capsys, no_simulation):
    argv = [a.replace("{d}", str(folder)) for a in argv]
    rc, out, err = sim_cli(argv, capsys)
    assert rc == 2
    assert err.endswith("\n") and err.count("\n") == 1, err  # one line
    assert err.startswith(f"sim {argv[0]}: error: "), err
    assert message.replace("{d}", str(folder)) in err
    assert "Traceback" not in err and "np.int64" not in err
    assert not (folder / "sim-out").exists() and not list(folder.glob("**/summary.json"))


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("flag", ["-o", "--report"])
def test_an_output_the_system_refuses_is_found_before_the_run(flag, folder, monkeypatch, capsys,
                                                              no_simulation):
    """``os.access`` says yes to root wherever it asks (here: to anyone, as for root); the
    output folder is probed for real, so ``-o /proc/x`` is one line before anything runs, not
    a traceback after the simulation."""
    import os
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: True)
    target = "/proc/x" if flag == "-o" else "/proc/x/r.html"
    rc, _, err = sim_cli(RUN + [flag, target], capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"sim run: error: {'--output' if flag == '-o' else '--report'} "
                          f"'{target}': cannot write there (")
    assert not (folder / "sim-out").exists()


@pytest.mark.parametrize("command", ["calibrate", "validate"])
def test_device_gpu_without_a_gpu_is_a_user_error(command, monkeypatch, capsys, no_simulation):
    from sim.costs import kernels

    def no_gpu(device="auto"):
        raise RuntimeError("device='gpu' but no CUDA GPU is usable through CuPy")
    monkeypatch.setattr(kernels, "array_module", no_gpu)
    rc, _, err = sim_cli([command, "--device", "gpu"], capsys)
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith(f"sim {command}: error: --device gpu: no CUDA GPU is usable")


def test_debug_shows_the_traceback_and_bugs_keep_theirs(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="--num-requests must be >= 1"):
        main(["--debug", "run", "-w", "azure-code", "-n", "0"])
    with pytest.raises(ValueError, match="--num-requests must be >= 1"):
        main(["run", "-w", "azure-code", "-n", "0", "--debug"])

    def bug(*args, **kwargs):  # only input errors become one line; a bug keeps its traceback
        raise KeyError("a bug")
    monkeypatch.setattr(sim.engine, "run", bug)
    with pytest.raises(KeyError):
        main(RUN + ["-o", str(tmp_path / "o")])


def test_real_process_prints_no_traceback(tmp_path):
    """The installed entry point, as a user runs it: one line, exit status 2."""
    (tmp_path / "f").write_text("")
    code = "import sys; from sim.cli import main; sys.exit(main())"
    for argv, message in ((["run", "-w", "azure-code", "-n", "5", "-o", str(tmp_path / "f" / "x")],
                           "cannot write there"),
                          (["validate", "--profile", str(tmp_path / "nope.json")],
                           "no such file")):
        p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 2, p.stderr
        assert p.stderr.count("\n") == 1 and message in p.stderr and "Traceback" not in p.stderr


def test_engine_errors_name_the_flags_the_user_typed(tmp_path, capsys):
    from sim.cli import main
    out = str(tmp_path / "o")
    assert main(["run", "-w", "sharegpt", "-n", "10", "-o", out]) == 2
    assert "give --rate REQ_PER_S" in capsys.readouterr().err
    assert main(["run", "--tp", "3", "-n", "10", "-o", out]) == 2
    assert "--tp 3 must divide" in capsys.readouterr().err
    assert main(["run", "--model", "llama-3.1-70b", "-n", "5", "-o", out]) == 2
    err = capsys.readouterr().err
    assert "(--tp 2)" in err and "tensor_parallel=" not in err
    toml = tmp_path / "t.toml"
    toml.write_text("tensor_parallel = 3\n")
    assert main(["run", str(toml), "-n", "5", "-o", out]) == 2
    assert f"{toml}: tensor_parallel 3 must divide" in capsys.readouterr().err


def test_a_draft_of_another_vocabulary_is_named_as_the_flag(tmp_path, capsys):
    from sim.cli import main
    assert main(["run", "-n", "5", "--spec-tokens", "3", "--draft-model", "tinyllama-1.1b",
                 "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sim run: error: --draft-model 'tinyllama-1.1b' has a vocabulary")


def test_an_acceptance_rate_column_without_speculation_is_a_warning(tmp_path, capsys):
    """The run is valid (speculation off is a baseline) but the column goes unused: the API
    warns, the CLI says so in one line; with speculation on, or the column all empty, nothing."""
    import warnings

    import pandas as pd

    csv = tmp_path / "w.csv"
    csv.write_text(HEADER.rstrip("\n") + ",acceptance_rate\n0,50,20,0.9\n0.5,60,10,0.2\n")
    df = pd.read_csv(csv)
    with pytest.warns(UserWarning, match="workload column acceptance_rate is ignored: "
                                         "speculative decoding is off"):
        sim.engine.run(df)
    spec = sim.engine.SpeculativeConfig(num_speculative_tokens=2, method="ngram")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sim.engine.run(df, speculative=spec)
        sim.engine.run(df.assign(acceptance_rate=float("nan")))
    rc, _, err = sim_cli(["run", "-w", str(csv), "-q", "--no-plots", "-o",
                          str(tmp_path / "o")], capsys)
    assert rc == 0 and err.count("\n") == 1, err
    assert err.startswith(f"sim run: warning: workload {csv}: column acceptance_rate is "
                          f"ignored: speculative decoding is off (give --spec-tokens K")
    rc, _, err = sim_cli(["run", "-w", str(csv), "-q", "--no-plots", "--spec-tokens", "2",
                          "--spec-method", "ngram", "-o", str(tmp_path / "p")], capsys)
    assert rc == 0 and err == "", err


def test_a_warning_repeated_by_a_search_is_printed_once(capsys):
    from sim.cli.main import main
    main(["capacity", "-w", "azure-code", "-n", "20", "--seed", "3", "--slo-ttft", "0.5"])
    warned = [x for x in capsys.readouterr().err.splitlines() if "warning:" in x]
    assert len(warned) == 1 and "--seed 3 changes nothing" in warned[0]  # (the CLI's own)
    main(["capacity", "-w", "azure-code", "-n", "20", "--kv-blocks", "100000", "--slo-ttft",
          "0.5"])  # (every run of the search warns of the pool)
    warned = [x for x in capsys.readouterr().err.splitlines() if "warning:" in x]
    assert len(warned) == 1 and warned[0].startswith(  # (in the flag's words, as sim run's)
        "sim capacity: warning: --kv-blocks 100,000 is a pool of 100,000 KV blocks")


def test_without_the_serve_extra_one_line_and_no_banner(monkeypatch, capsys):
    """Without Starlette/uvicorn, sim serve names the extra and never says it listens."""
    import sys
    from sim.cli import main
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # (import uvicorn: ImportError)
    assert main(["serve", "--port", "18731"]) == 2
    err = capsys.readouterr().err
    assert err == ("sim serve: error: sim serve needs Starlette and uvicorn: pip install "
                   "'llm-serving-sim[serve]'\n")
