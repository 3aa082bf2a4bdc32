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


def test_the_users_model_is_joined_from_its_parts_beside_its_own_cache_folders(tmp_path: Path) -> None:
    """The Q4_K_M file the tests run, joined once from its six PyPI parts and checked by its sha256, in a folder
    that is neither its conversion's nor its config's (the same content hash names those)."""
    from inference.llm.loader import gguf_cache_folder, gguf_config_folder
    from inference.models import QWEN_CODER_Q4_K_M, qwen_coder_gguf

    path = qwen_coder_gguf(tmp_path)
    assert path.stat().st_size == QWEN_CODER_Q4_K_M.size and path.name.endswith(".gguf")
    assert path.parent not in (gguf_cache_folder(path, tmp_path), gguf_config_folder(path, tmp_path))
    joined_at = path.stat().st_mtime_ns
    assert qwen_coder_gguf(tmp_path) == path and path.stat().st_mtime_ns == joined_at  # reused, not joined again
    assert own_model_name(path) == "qwen2.5-coder-0.5b-instruct-q4_k_m"
