"""The gateway against `transformers serve` with continuous batching, both over their OpenAI HTTP API
with the same client and the same model, measured in one run; prints JSON.

    python -m benchmarks.openai_servers [--rounds 2] [--tokens 64] [--llm-kernels auto] [--torch-isa avx2]

Rounds alternate the two servers, one at a time on the machine (each is started, measured and stopped
in turn): the gateway (`gateway serve`, text only, its defaults but for ``--llm-kernels``) and
`transformers serve --continuous-batching --dtype bfloat16` (capped at 512 batch tokens and 5% of
memory for its KV blocks: uncapped it reserves 60% of free RAM on a CPU) on the gateway's converted
copy of the embedded model. Each figure is the median over rounds, read from streamed chat completions:

- TTFT of a short chat prompt;
- single-stream decode tok/s (completion tokens counted by re-tokenizing the text with the model's
  tokenizer, the same for both; the first token's time excluded);
- TTFT of a ~600-token system prompt the first time, and of the same system prompt with another
  question after it;
- aggregate tok/s of 8 concurrent streams.

``--torch-isa avx2`` limits torch's own kernels in both servers to AVX2 (``ATEN_CPU_CAPABILITY``,
``ONEDNN_MAX_CPU_ISA``, ``MKL_ENABLE_INSTRUCTIONS``): with ``--llm-kernels avx2``, an AVX512 host then
runs what an AVX2-only one would (its memory and clocks stay its own, so it is a proxy, not that host).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from benchmarks.engine import LONG_QUESTIONS, system_prompt
from gateway.platform.processes import GatewayProcess, free_port
from inference.llm.loader import gguf_cache_folder
from inference.models import embedded_llm

STREAMS = 8


class Client:
    """Streamed chat completions against one server."""

    def __init__(self, url: str, model: str, tokenizer) -> None:
        self.url, self.model, self.tokenizer = url, model, tokenizer

    def stream(self, messages: list[dict], max_tokens: int) -> dict:
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                "stream": True}
        sent = time.monotonic()
        first = last = None
        text = []
        with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=body, timeout=600) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or []
                delta = (choices[0].get("delta") or {}).get("content") if choices else None
                if delta:
                    last = time.monotonic()
                    first = first or last
                    text.append(delta)
        if first is None:
            raise RuntimeError(f"{self.url} streamed no text")
        tokens = len(self.tokenizer.encode("".join(text), add_special_tokens=False))
        return {"ttft_s": first - sent, "tokens": tokens, "first_at": first, "last_at": last, "sent_at": sent}


def measure(client: Client, tokens: int, variant: int) -> dict:
    short = client.stream([{"role": "user", "content": "Hi"}], 4)
    one = client.stream([{"role": "user", "content": LONG_QUESTIONS[0]}], tokens)
    system = system_prompt(variant, 600, client.tokenizer)
    first = client.stream([{"role": "system", "content": system}, {"role": "user", "content": "When do you open?"}], 4)
    again = client.stream([{"role": "system", "content": system}, {"role": "user", "content": "Can I return paint?"}], 4)
    prompts = [[{"role": "user", "content": LONG_QUESTIONS[i % len(LONG_QUESTIONS)]}] for i in range(STREAMS)]
    with ThreadPoolExecutor(STREAMS) as pool:
        started = time.monotonic()
        runs = list(pool.map(lambda m: client.stream(m, tokens), prompts))
    wall = max(r["last_at"] for r in runs) - started
    return {
        "short_prompt_ttft_s": short["ttft_s"],
        "single_stream_decode_tok_s": (one["tokens"] - 1) / (one["last_at"] - one["first_at"]),
        "single_stream_tokens": one["tokens"],
        "system_prompt_first_ttft_s": first["ttft_s"],
        "system_prompt_other_question_ttft_s": again["ttft_s"],
        "eight_streams_tok_s": sum(r["tokens"] for r in runs) / wall,
    }


def isa_env(torch_isa: str) -> dict[str, str]:
    """Environment that limits torch's kernels (ATen, oneDNN, MKL) to ``torch_isa`` ("native": none)."""
    if torch_isa == "native":
        return {}
    return {"ATEN_CPU_CAPABILITY": torch_isa, "ONEDNN_MAX_CPU_ISA": torch_isa.upper(),
            "MKL_ENABLE_INSTRUCTIONS": torch_isa.upper()}


def run_gateway(args, log_dir: Path, tokenizer, variant: int) -> tuple[dict, dict]:
    gateway = GatewayProcess(log_dir / "gateway.log", args=["--no-load-voice-models", "--llm-kernels",
                                                           args.llm_kernels, "--cache-dir", args.cache_dir],
                             env=isa_env(args.torch_isa)).start()
    try:
        health = gateway.wait_ready(timeout_s=600)
        client = Client(gateway.url, "smollm2-135m-instruct", tokenizer)
        client.stream([{"role": "user", "content": "Hi"}], 4)  # one-off allocations
        return measure(client, args.tokens, variant), health["llm"]
    finally:
        gateway.stop()


@contextlib.contextmanager
def serving(command: list[str], health_url: str, log_path: Path, env: dict[str, str] | None = None,
            timeout_s: float = 600) -> Iterator[None]:
    """A server process, started with ``command`` and ready once ``health_url`` answers 200; stopped after."""
    with open(log_path, "ab") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"{Path(command[0]).name} exited: see {log_path}")
            try:
                if httpx.get(health_url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{Path(command[0]).name} did not start: see {log_path}")
            time.sleep(0.5)
        yield
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@contextlib.contextmanager
def transformers_serve(folder: Path, log_path: Path, env: dict[str, str] | None = None,
                       timeout_s: float = 600) -> Iterator[str]:
    """`transformers serve --continuous-batching` (bfloat16, capped at 512 batch tokens and 5% of memory for
    its KV blocks) on a model folder, offline; yields its URL once /health answers, and stops it."""
    port = free_port()
    cli = shutil.which("transformers", path=os.path.dirname(sys.executable)) or "transformers"
    command = [cli, "serve", "--continuous-batching", "--dtype", "bfloat16", "--cb-max-batch-tokens", "512",
               "--cb-max-memory-percent", "0.05", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
               str(folder)]
    url = f"http://127.0.0.1:{port}"
    with serving(command, f"{url}/health", log_path, {"HF_HUB_OFFLINE": "1", **(env or {})}, timeout_s):
        yield url


def run_transformers_serve(args, folder: Path, log_dir: Path, tokenizer, variant: int) -> dict:
    with transformers_serve(folder, log_dir / "transformers-serve.log", isa_env(args.torch_isa)) as url:
        client = Client(url, str(folder), tokenizer)
        client.stream([{"role": "user", "content": "Hi"}], 4)  # loads the model, one-off allocations
        return measure(client, args.tokens, variant)


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64, help="max_tokens of the decoding requests")
    ap.add_argument("--llm-kernels", default="auto", help="the gateway's --llm-kernels")
    ap.add_argument("--torch-isa", choices=("native", "avx2"), default="native",
                    help="limit torch's own kernels in both servers to this instruction set")
    ap.add_argument("--cache-dir", default=str(Path("~/.cache/realtime-gateway").expanduser()))
    args = ap.parse_args(argv)
    folder = gguf_cache_folder(embedded_llm(), Path(args.cache_dir))
    if not (folder / "config.json").is_file():
        ap.error(f"{folder} is missing: start the gateway once to convert the embedded model")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ours, theirs, paths = [], [], {}
    with tempfile.TemporaryDirectory(prefix="gw-bench-servers-") as tmp:
        for r in range(args.rounds):
            print(f"round {r + 1}: gateway...", file=sys.stderr)
            figures, paths = run_gateway(args, Path(tmp), tokenizer, 300 + r)
            ours.append(figures)
            print(f"round {r + 1}: transformers serve...", file=sys.stderr)
            theirs.append(run_transformers_serve(args, folder, Path(tmp), tokenizer, 300 + r))
    report: dict = {"gateway_llm": paths, "torch_isa": args.torch_isa, "rounds": args.rounds, "figures": {}}
    for key in ours[0]:
        a, b = statistics.median(f[key] for f in ours), statistics.median(f[key] for f in theirs)
        report["figures"][key] = {"gateway": round(a, 4), "transformers_serve_cb_bf16": round(b, 4)}
        if not key.endswith("_tokens"):
            # Times: theirs over ours; rates: ours over theirs. Above 1, the gateway is ahead.
            report["figures"][key]["gateway_advantage"] = round(b / a if key.endswith("ttft_s") else a / b, 2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
