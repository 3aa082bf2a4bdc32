"""The engine on a GGUF file's own types (weight format "gguf": inference/llm/gguf_weights.py), on the embedded
model's real file: which format each part runs in, closeness to the file's own numbers, and what is refused."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter

from inference.llm import cpu_kernels
from inference.llm.backend import SamplingParams
from inference.llm.engine import EngineConfig, LLMEngine
from inference.llm.forward import LeanForward
from inference.llm.gguf_weights import GgufIndex, GgufTypeError, GgufWeights
from inference.llm.loader import GGUF_INDEX, gguf_config_folder, load_lm
from inference.llm.model_support import UnsupportedModel
from inference.llm.step_plan import Segment
from inference.models import embedded_llm
from tests.engine.batching import full_pool

TEXT = ("The history of the city begins with a small settlement on the river, where traders met to exchange salt, "
        "grain and cloth. Over the centuries it grew into a market town, then a port, and finally a capital.")


@pytest.fixture(scope="module")
def gguf(lm) -> GgufWeights:
    """The file's blocks for the fixture's float32 model (converted from the same file)."""
    return GgufWeights(GgufIndex.read(embedded_llm()), lm.model)


def _needs(isa: str) -> None:
    if isa not in cpu_kernels.supported_isas():
        pytest.skip(f"this CPU does not run the {isa} build")


def _logits(fwd: LeanForward, ids: torch.Tensor) -> torch.Tensor:
    n = len(ids)
    return fwd.forward(full_pool(fwd, 1, 128), ids, torch.arange(n), [Segment(0, 0, n)], list(range(n)))


@pytest.mark.parametrize("isa", cpu_kernels.ISAS)
async def test_the_files_own_types_run_on_the_kernels_and_batching_changes_nothing(lm, gguf, chat_ids, collect, isa):
    _needs(isa)
    eng = LLMEngine(dataclasses.replace(lm, weight_format="gguf", kernels=isa, gguf=gguf),
                    EngineConfig(prefix_cache_bytes=0))
    eng.start()
    try:
        paths = eng.fwd.describe()
        assert paths["weights"] == "gguf" and paths["matmul"] == paths["head"] == paths["attention"] == isa
        assert paths["layers_in_one_call"] == "true"
        assert paths["gguf_qkv"] == paths["gguf_down"] == "Q4_1 as 4-bit groups"
        assert paths["gguf_head"] == "Q8_0 as 8-bit groups"  # the tied embedding, in its own 8 bits
        prompts = [chat_ids(("user", q)) for q in ("What is the capital of France?", "Name a primary colour.")]
        params = SamplingParams(temperature=0, repetition_penalty=1.0, max_tokens=12)
        solo = [await collect(eng, p, params) for p in prompts]
        batched = await asyncio.gather(*(collect(eng, p, params) for p in prompts))
        assert [r.token_ids for r in batched] == [r.token_ids for r in solo]
    finally:
        eng.close()


@pytest.mark.parametrize("isa", cpu_kernels.ISAS)
def test_the_files_own_types_follow_its_numbers_closer_than_int4(lm, gguf, isa):
    """Teacher-forced logits over a paragraph against float32 with the file's de-quantized values (the fixture's
    model): the file's Q8_0 head kept as 8-bit groups errs far less than int4's head re-quantized per channel."""
    _needs(isa)
    ids = torch.tensor(lm.tokenizer(TEXT)["input_ids"])
    exact = _logits(LeanForward.for_model(lm.model, lm.context_window, "native", kernel_dir=lm.cache_dir,
                                          kernels=isa), ids)
    own = _logits(LeanForward.for_model(lm.model, lm.context_window, "gguf", kernel_dir=lm.cache_dir, kernels=isa,
                                        gguf=gguf), ids)
    int4 = _logits(LeanForward.for_model(lm.model, lm.context_window, "int4", kernel_dir=lm.cache_dir,
                                         kernels=isa), ids)
    err_own, err_int4 = ((own - exact).abs().max().item(), (int4 - exact).abs().max().item())
    top_own = (own.argmax(-1) == exact.argmax(-1)).float().mean().item()
    assert err_own < err_int4 / 2, (err_own, err_int4)
    assert top_own >= 0.97, top_own


def test_the_files_own_types_need_the_engines_kernels(lm, gguf):
    with pytest.raises(UnsupportedModel, match="engine's kernels"):
        LeanForward(lm.model, 512, weight_format="gguf", kernel_dir=lm.cache_dir, kernels="torch", gguf=gguf)
    with pytest.raises(ValueError, match="GgufWeights"):
        LeanForward(lm.model, 512, weight_format="gguf", kernel_dir=lm.cache_dir)


async def test_auto_reads_a_gguf_files_blocks_without_converting_it(tmp_path, chat_ids, collect):
    """Where the engine's kernels run: nothing converted, no float copy of a linear weight, a cache of a few MB
    (config, tokenizer, the tensors' index) that the next start reuses; the answers as from the converted model."""
    if not cpu_kernels.supported_isas():
        pytest.skip("the engine's kernels do not run on this CPU")
    own = load_lm(embedded_llm(), cache_dir=tmp_path, max_context_tokens=512)
    assert own.weight_format == "gguf" and own.gguf is not None and not own.converted
    linears = [m for m in own.model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.numel() == 0 for m in linears if m is not own.model.lm_head)
    folder = gguf_config_folder(embedded_llm(), tmp_path)
    assert (folder / GGUF_INDEX).is_file() and not list(folder.glob("*.safetensors"))
    assert sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file()) < 20 * 2**20
    kept_at = (folder / GGUF_INDEX).stat().st_mtime_ns
    again = load_lm(embedded_llm(), cache_dir=tmp_path, max_context_tokens=512)
    # The next start reads what the first kept, and writes nothing again.
    assert again.gguf is not None and again.gguf.index == own.gguf.index
    assert (folder / GGUF_INDEX).stat().st_mtime_ns == kept_at
    assert {p.name for p in tmp_path.iterdir() if p.is_dir()} == {"kernels", folder.name}
    eng = LLMEngine(own, EngineConfig(prefix_cache_bytes=0))
    eng.start()
    try:
        answer = await collect(eng, chat_ids(("user", "What is the capital of France?")),
                               SamplingParams(temperature=0, repetition_penalty=1.0, max_tokens=12))
    finally:
        eng.close()
    assert "Paris" in answer.text


def test_the_index_is_kept_and_read_back(gguf, tmp_path):
    kept = tmp_path / "index.json"
    first = GgufIndex.read(embedded_llm(), kept)
    assert kept.is_file() and GgufIndex.read(embedded_llm(), kept) == first == gguf.index
    assert first.types() == {"Q4_1": 210, "F32": 61, "Q8_0": 1} and first.architecture == "llama"
    kept.write_text("{not json")  # a damaged index is read again from the file
    assert GgufIndex.read(embedded_llm(), kept) == first


def test_a_truncated_file_is_refused_by_name_before_anything_loads(tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(embedded_llm(), "rb") as source:
        cut.write_bytes(source.read(1 << 20))
    with pytest.raises(GgufTypeError, match="cut.gguf is not a readable GGUF file"):
        load_lm(cut, cache_dir=tmp_path)
    assert not [p for p in tmp_path.iterdir() if p.is_dir() and p.name != "kernels"]  # nothing converted


def test_a_type_the_engine_does_not_serve_is_refused_by_name(tmp_path):
    path = tmp_path / "iq.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((256, 66), dtype=np.uint8),  # 256 x 256 in IQ2_XXS's bytes
                      raw_dtype=GGMLQuantizationType.IQ2_XXS)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GgufTypeError, match=r"blk\.0\.attn_q\.weight is IQ2_XXS, a GGUF type the engine does not "
                                             r"serve \(it serves .*Q4_K.*\)"):
        GgufIndex.read(path)


def _one_tensor_file(path, architecture: str, tokenizer: bool) -> None:
    writer = GGUFWriter(str(path), architecture)
    writer.add_name("tiny")
    if tokenizer:  # gpt2's BPE fields, as a Llama-3 or Qwen file has them
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(["a", "b", "ab"])
        writer.add_token_merges(["a b"])
    writer.add_tensor("token_embd.weight", np.zeros((3, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(("architecture", "tokenizer", "reason"), [
    ("rwkv6", True, "architecture rwkv6 is not supported"),  # no reader for it in transformers
    ("llama", False, "Cannot build a tokenizer"),  # a vocabulary it cannot use
])
def test_a_file_whose_architecture_or_tokenizer_cannot_be_read_is_refused_by_name_at_start(
        tmp_path, architecture, tokenizer, reason):
    path = tmp_path / f"odd-{architecture}.gguf"
    _one_tensor_file(path, architecture, tokenizer)
    for dtype in ("auto", "float32"):  # the engine's blocks and the conversion
        with pytest.raises(UnsupportedModel, match=rf"odd-{architecture}\.gguf \(architecture '{architecture}'\): "
                                                   rf"its config or tokenizer cannot be read: .*{reason}.* The engine "
                                                   r"serves GGUF files of llama, mistral, qwen2$"):
            load_lm(path, dtype=dtype, cache_dir=tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache").iterdir() if p.is_dir() and p.name != "kernels"]  # nothing kept


def test_without_the_engines_kernels_a_gguf_file_runs_converted_on_torchs(gateway_cache_dir, monkeypatch):
    """No gcc (the kernels cannot be built): the file is converted and its 4-bit layers run as int4 on torch's
    kernel, as before, instead of failing to start."""
    monkeypatch.setattr(cpu_kernels, "load", lambda cache_dir, isa: None)
    own = load_lm(embedded_llm(), cache_dir=gateway_cache_dir, max_context_tokens=512)
    assert own.weight_format == "int4" and own.gguf is None
