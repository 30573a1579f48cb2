"""A tiny random Qwen2 model with a byte-level BPE tokenizer, built offline in seconds.

vLLM's CPU attention rejects a head size of 16, so: hidden 128, 2 heads, 1 KV
head, 2 layers, a vocabulary of about 320 tokens trained on a few sentences.
It serves with ``--dtype float32 --enforce-eager --max-model-len 256``.
"""

from __future__ import annotations

from pathlib import Path

TEXT = [
    "module adder(input a, input b, output y); assign y = a + b; endmodule",
    "the quick brown fox jumps over the lazy dog",
]
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
SERVE_ARGS = ("--dtype", "float32", "--enforce-eager")
MAX_MODEL_LEN = 256


def build_tiny_model(folder: Path) -> Path:
    """Write the model and tokenizer into ``folder`` and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(TEXT * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    config = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        eos_token_id=fast.eos_token_id,
        bos_token_id=fast.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    return folder
