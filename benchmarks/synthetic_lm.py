"""The embedded model's shape with random weights and a byte-level tokenizer made in memory.

A GPU machine gets no weight files (64 MiB travel with a call, and no hub is reachable), so its tests
and benchmark build the model here: SmolLM2-135M-Instruct's configuration, seeded random weights (the
same seed gives the same weights, so two copies can be compared token for token), and a tokenizer whose
first 256 ids are bytes, with a ChatML template, so that the engine and the benchmarks' prompt
rendering run unchanged. Speed does not depend on the weights' values; answers are noise.
"""

from __future__ import annotations

from pathlib import Path

import torch

from inference.llm.loader import LoadedLM

EMBEDDED_SHAPE = {  # SmolLM2-135M-Instruct's config.json, less its weights
    "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
    "head_dim": 64, "vocab_size": 49152, "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True,
}
EMBEDDED_LAYERS = 30
# The shapes the GPU benchmark and suite run (Llama layouts of these models' sizes: the forward treats
# Qwen2 as Llama; its q/k/v biases cost nothing measurable). name -> (config, layers)
SHAPES: dict[str, tuple[dict, int]] = {
    "smollm2-135m": (EMBEDDED_SHAPE, EMBEDDED_LAYERS),
    "qwen2.5-1.5b": ({"hidden_size": 1536, "intermediate_size": 8960, "num_attention_heads": 12,
                      "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-6,
                      "rope_theta": 1000000.0, "tie_word_embeddings": True}, 28),
    "llama-3.2-3b": ({"hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 24,
                      "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "rms_norm_eps": 1e-5,
                      "rope_theta": 500000.0, "tie_word_embeddings": True}, 28),
    "qwen2.5-7b": ({"hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
                    "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 152064, "rms_norm_eps": 1e-6,
                    "rope_theta": 1000000.0, "tie_word_embeddings": False}, 28),
}
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def random_model(layers: int = EMBEDDED_LAYERS, dtype: torch.dtype = torch.float32, device: str = "cpu",
                 seed: int = 0, max_positions: int = 2048, shape: str = "smollm2-135m",
                 vocab: int | None = None) -> torch.nn.Module:
    """A Llama model of one of SHAPES (``layers`` of its own; ``vocab`` tokens instead of its own where
    given) with seeded random weights, made on ``device`` directly (a 7B shape's weights would take
    minutes to initialize on a CPU)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    shape_config = {**SHAPES[shape][0], **({"vocab_size": vocab} if vocab is not None else {})}
    config = LlamaConfig(num_hidden_layers=layers, max_position_embeddings=max_positions, **shape_config)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype=dtype).eval()


def byte_tokenizer(vocab_size: int = int(EMBEDDED_SHAPE["vocab_size"])):
    """A byte-level tokenizer (no merges) over the model's whole vocabulary: ids beyond the bytes and
    the three ChatML specials decode as ``<tN>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    for token in specials:
        vocab[token] = len(vocab)
    while len(vocab) < vocab_size:
        vocab[f"<t{len(vocab)}>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    wrapped.chat_template = CHATML
    wrapped.padding_side = "left"
    return wrapped


def random_loaded_lm(cache_dir: Path, *, layers: int | None = None, device: str = "cpu",
                     dtype: torch.dtype | None = None, seed: int = 0, kernels: str = "auto",
                     shape: str = "smollm2-135m", max_positions: int = 2048, vocab: int | None = None) -> LoadedLM:
    """A LoadedLM of :func:`random_model` and :func:`byte_tokenizer`, as ``load_lm`` would return
    (bfloat16 on CUDA, float32 on a CPU, unless ``dtype``)."""
    dtype = dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    model = random_model(SHAPES[shape][1] if layers is None else layers, dtype, device, seed, max_positions, shape,
                         vocab)
    tokenizer = byte_tokenizer(int(model.config.vocab_size))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return LoadedLM(model=model, tokenizer=tokenizer, vocab_size=int(model.config.vocab_size), device=torch.device(device), dtype=dtype,
                    context_window=model.config.max_position_embeddings,
                    eos_token_ids=frozenset({tokenizer.eos_token_id}), source=Path(f"random-seed-{seed}"),
                    load_seconds=0.0, converted=False, cache_dir=Path(cache_dir), kernels=kernels)
