"""Rows/s of OpenVINO GenAI's ContinuousBatchingPipeline by its scheduling, on batchinfer's conversion of
SmolLM2-135M-Instruct, f32, greedy, the prompts of examples/bench/cpu_engines.py's workloads as batchinfer
tokenizes them. One process holds a pipeline per setting; each round gives every setting
the same fresh rows (no prefix-cache hits across rounds), settings in alternating order, the load beside each
figure. The first round on a new pipeline is its warm-up. `--in-flight 0` is the pipeline's default scheduling
(dynamic_split_fuse, which batchinfer runs: each step max_num_batched_tokens tokens of as many rows as the KV cache
holds); N > 0 is its vLLM-like scheduling with at most N sequences in flight (dynamic_split_fuse false and
max_num_seqs N, the only scheduling that reads max_num_seqs; a step then takes whole prompts, so
max_num_batched_tokens is raised to the longest).

    python examples/bench/openvino_in_flight.py --workload A --rows 64 --in-flight 0,16,32,64
    python examples/bench/openvino_in_flight.py --workload B --rows 48 --in-flight 0,16,32,64
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "models")]


def main() -> None:
    import numpy as np
    import openvino as ov
    import openvino_genai
    from convert_smollm2 import default_folder
    from cpu_engines import WORKLOADS, scheduling, sms_rows
    from transformers import AutoTokenizer

    from batchinfer.backends import openvino
    from batchinfer.backends.models import model_identity
    from batchinfer.backends.openvino_causal import conversion
    from batchinfer.runners.openvino_engine import F32

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="A", choices=sorted(WORKLOADS))
    parser.add_argument("--rows", type=int, default=64, help="rows per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--in-flight", default="0,16,32,64", help="0: the default scheduling (dynamic_split_fuse)")
    parser.add_argument("--data", type=Path, default=HERE.parent / "sms_spam")  # the shipped messages
    parser.add_argument("--model", type=Path, help="a SmolLM2 folder that batchinfer has converted")
    args = parser.parse_args()
    model, counts = args.model or default_folder(), [int(n) for n in args.in_flight.split(",")]
    folder = openvino.hit(conversion(model_identity(model)))
    if folder is None:
        sys.exit(f"no conversion of {model} in the cache: run a generate job on it once (engine auto)")
    ask, new_tokens = WORKLOADS[args.workload]
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": ask.format(text=t)}], add_generation_prompt=True, tokenize=False
        )
        for t in sms_rows(args.data, args.rows * args.rounds)
    ]
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    pipelines = {}
    for n in counts:
        scheduler = openvino_genai.SchedulerConfig()
        scheduler.enable_prefix_caching = True
        for key, value in scheduling(n, max(map(len, ids))).items():
            setattr(scheduler, key, value)
        pipelines[n] = openvino_genai.ContinuousBatchingPipeline(str(folder), scheduler, "CPU", dict(F32))
    config = openvino_genai.GenerationConfig()
    config.max_new_tokens, config.do_sample = new_tokens, False
    config.stop_token_ids = {tokenizer.eos_token_id}
    rates: dict[int, list[str]] = {n: [] for n in counts}
    for r in range(args.rounds):
        rows = ids[r * args.rows : (r + 1) * args.rows]
        for n in counts if r % 2 == 0 else counts[::-1]:
            load, started = os.getloadavg()[0], time.perf_counter()
            pipelines[n].generate([ov.Tensor(np.asarray([p], dtype=np.int64)) for p in rows], [config] * len(rows))
            rates[n].append(f"{len(rows) / (time.perf_counter() - started):.2f} (load {load:.1f})")
    print(f"workload {args.workload}, {args.rows} rows a round; rows/s by round")
    for n in counts:
        print(f"{f'{n} in flight' if n else 'default scheduling'}: " + ", ".join(rates[n]))


if __name__ == "__main__":
    main()
