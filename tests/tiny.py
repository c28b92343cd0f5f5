"""Tiny random-weight models for fast engine tests (not for claims)."""

from __future__ import annotations

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

# A model config for tools/arch_curve.py-style builders (random weights from a config): tiny, any device.
TINY_ARCH = {"tiny-llama": dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                max_position_embeddings=1024)}  # fmt: skip


def tiny_llama(
    *, seed: int = 0, vocab: int = 96, dtype: torch.dtype = torch.float32, max_positions: int = 512, **config
) -> LlamaForCausalLM:
    """A 2-layer random Llama; ``config`` overrides other LlamaConfig fields (e.g. tie_word_embeddings)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        **{
            "vocab_size": vocab,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": max_positions,
            "eos_token_id": None,
            "bos_token_id": None,
            "pad_token_id": None,
            **config,
        }
    )
    return LlamaForCausalLM(cfg).to(dtype).eval()


def tiny_qwen2(
    *, seed: int = 0, vocab: int = 96, dtype: torch.dtype = torch.float32, max_positions: int = 512, **config
) -> Qwen2ForCausalLM:
    """A 2-layer random Qwen2 (Qwen2.5's architecture: biased q/k/v projections, untied head by default).
    transformers initialises the biases to zero; here q and k get random ones, so the query bias shapes every
    attention score (v keeps zero: a random v bias drives this tiny model into repeating one token)."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        **{
            "vocab_size": vocab,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": max_positions,
            "tie_word_embeddings": False,
            "eos_token_id": None,
            "bos_token_id": None,
            "pad_token_id": None,
            **config,
        }
    )
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.bias.normal_(0.0, 1.0)
            layer.self_attn.k_proj.bias.normal_(0.0, 1.0)
    return model.to(dtype).eval()


ARCHS = {"llama": tiny_llama, "qwen2": tiny_qwen2}  # the dense architectures every engine path is tested on


def tiny_llama_dir(directory, tokenizer=None, **kwargs) -> LlamaForCausalLM:
    """``tiny_llama(**kwargs)`` saved as a Hugging Face directory (with ``tokenizer`` when given); returns the model."""
    model = tiny_llama(**kwargs)
    model.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return model


def tiny_gemma3(*, seed: int = 0, vocab: int = 96, sliding_window: int = 16) -> Gemma3ForCausalLM:
    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        sliding_window=sliding_window,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    return Gemma3ForCausalLM(cfg).eval()


def repetitive_prompt(*, vocab: int = 96, length: int = 40, seed: int = 0) -> torch.Tensor:
    """A prompt with repeats, so that prompt lookup and the pool have something to find."""
    g = torch.Generator().manual_seed(seed)
    motif = torch.randint(3, vocab, (8,), generator=g)
    noise = torch.randint(3, vocab, (length,), generator=g)
    ids = torch.cat([motif, noise[: length // 2], motif, noise[length // 2 :]])
    return ids.unsqueeze(0)


def hf_greedy(model, ids: torch.Tensor, n: int) -> list[int]:
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
    )
    return out[0, ids.shape[1] :].tolist()


def word_tokenizer(vocab: int = 96):
    """A word-level tokenizer over ``w2 .. w{vocab-1}`` (0 unknown, 1 EOS): real text in, tiny-model ids out."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"[UNK]": 0, "[EOS]": 1} | {f"w{i}": i for i in range(2, vocab)}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]")


def hub_snapshot_dir(hub_cache, repo_id: str, revision: str = "0" * 40):
    """Where the Hugging Face hub cache keeps ``repo_id``'s snapshot (``models--org--name/snapshots/<rev>``),
    with ``refs/main`` pointing at it: save a model there and it reads as downloaded."""
    from pathlib import Path

    repo = Path(hub_cache) / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return repo / "snapshots" / revision
