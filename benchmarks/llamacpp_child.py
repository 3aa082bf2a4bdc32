"""llama.cpp's side of benchmarks/llamacpp.py: one round of every figure, run in its own process.

    python benchmarks/llamacpp_child.py SPEC.json     # prints one JSON object

Imports only llama_cpp and numpy, so it runs in any environment that has llama-cpp-python. SPEC:
{"gguf": path, "threads": n, "tokens": n, "prompts": {"short", "system_first", "system_other":
token ids, "streams": [token ids], "eos": [ids]}}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import Llama, LogitsProcessorList


def llama_round(spec: dict) -> dict:
    llm = Llama(model_path=spec["gguf"], n_threads=spec["threads"], n_threads_batch=spec["threads"],
                n_ctx=2048, n_batch=512, verbose=False)
    eos = np.array(spec["prompts"]["eos"], dtype=np.int64)

    def no_eos(_ids, scores):
        scores[eos] = -np.inf  # fixed-length runs, as the engine's ignore_eos
        return scores

    def run(ids: list[int], tokens: int, reset: bool) -> tuple[float, float, list[int]]:
        """(seconds to the first token, decode tok/s, the tokens), greedy."""
        if reset:
            llm.reset()  # forget the evaluated prefix: the prompt is computed whole
        out: list[int] = []
        t0 = time.perf_counter()
        first = end = t0
        for tok in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True,
                                logits_processor=LogitsProcessorList([no_eos])):
            end = time.perf_counter()
            if not out:
                first = end
            out.append(int(tok))
            if len(out) == tokens:
                break
        return first - t0, (len(out) - 1) / max(end - first, 1e-9), out

    p, tokens = spec["prompts"], spec["tokens"]
    run(p["short"], 4, True)  # warm-up: the first evaluation pays one-off costs
    short_ttft, _, _ = run(p["short"], 1, True)
    _, decode, short_tokens = run(p["short"], tokens, True)
    system_first, _, _ = run(p["system_first"], 1, True)
    system_other, _, _ = run(p["system_other"], 1, False)  # reuses the evaluated system prompt
    t0 = time.perf_counter()
    total = sum(len(run(ids, tokens, False)[2]) for ids in p["streams"])  # one sequence at a time
    wall = time.perf_counter() - t0
    return {"short_ttft_s": short_ttft, "decode_tok_s": decode, "system_first_ttft_s": system_first,
            "system_other_question_ttft_s": system_other, "eight_streams_tok_s": total / wall,
            "short_tokens": short_tokens,
            # The instruction sets this llama.cpp build uses (AVX2 = 1, AVX512 = 0, ...): which peer was measured.
            "system_info": llama_cpp.llama_print_system_info().decode()}


if __name__ == "__main__":
    print(json.dumps(llama_round(json.loads(Path(sys.argv[1]).read_text()))))
