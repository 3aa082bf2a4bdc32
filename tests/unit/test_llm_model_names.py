"""--model-name: what the LLM is called at /v1/models when it does not say: the model's own name."""

from __future__ import annotations

from pathlib import Path

from gateway.platform.config import EMBEDDED_MODEL_NAME, Settings, own_model_name


def test_the_model_is_called_by_its_own_name_unless_told() -> None:
    assert Settings().model_name == EMBEDDED_MODEL_NAME == "smollm2-135m-instruct"
    assert Settings(llm_model=Path("/m/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")).model_name == \
        "qwen2.5-coder-0.5b-instruct-q4_k_m"
    assert Settings(llm_model=Path("/models/Llama-3.2-1B-Instruct")).model_name == "Llama-3.2-1B-Instruct"
    assert Settings(llm_model=Path("/m/a.GGUF"), model_name="mine").model_name == "mine"
    assert Settings(llm_model=Path("/m/a.gguf"), model_name="  ").model_name == "a"
    assert own_model_name(Path("~/x.gguf")) == "x"
