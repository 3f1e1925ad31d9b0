"""Build the tiny random-weight Llama the real-vLLM test tier serves.

No weights can be downloaded on the machines this project runs on, so the model
is made here: a byte-level BPE tokenizer trained on a few strings, a 2-layer
Llama with random (seeded) weights, and a chat template so the chat, responses
and messages routes work. Run with the vLLM environment's interpreter (it needs
``torch``, ``transformers`` and ``tokenizers``, which vLLM pins)::

    .cache/vllm-venv/bin/python scripts/realvllm_model.py .cache/realvllm-model
    .cache/vllm-venv/bin/python scripts/realvllm_model.py .cache/realvllm-model-long 131072

The optional second argument is the context window (``max_position_embeddings``,
default 8192). The long variant has the same weights (same seed, same shapes:
RoPE has no learned positions) and serves the what-if validation's long-context
sessions, tens of thousands of tokens a prompt (docs/whatif.md).

Shape choices: head dim 64 (vLLM's CPU attention rejects 16), 2 KV heads (GQA,
like the models Kairos serves), vocabulary 1024, 1.3 M parameters: vLLM on two
cores starts it in about a minute and decodes hundreds of tokens a second.
The output text is noise; token counts, KV blocks and metrics are real.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for part in m['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<|bos|>", "<|eos|>", "<|pad|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
VOCAB = 1024
DEFAULT_MAX_LEN = 8192
CORPUS = [
    "Kairos lowers the GPU clock while the KV cache has headroom.",
    "An agent calls the model many times; its context grows every turn.",
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "vLLM keeps every running request's tokens in paged KV cache blocks.",
    "When the cache overflows, requests are preempted and recomputed later.",
]


def build(out: Path, max_len: int = DEFAULT_MAX_LEN) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    bos, eos, pad = SPECIAL[:3]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = max_len
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_len,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    (out / "kairos-model.json").write_text(
        json.dumps(
            {
                "parameters": params,
                "vocab_size": VOCAB,
                "tokenizer_vocab": tok.get_vocab_size(),
                "max_position_embeddings": max_len,
            }
        )
        + "\n"
    )
    print(
        f"tiny model: {params} parameters, tokenizer vocab {tok.get_vocab_size()}, "
        f"window {max_len} -> {out}"
    )


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and not sys.argv[2].isdigit()):
        sys.exit("usage: realvllm_model.py OUT_DIR [MAX_LEN]")
    build(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) == 3 else DEFAULT_MAX_LEN)
