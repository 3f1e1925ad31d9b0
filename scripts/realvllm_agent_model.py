"""Derive the model the real agent clients run against from the tier's tiny model.

Claude Code, the Codex CLI and mini-swe-agent (tests/realvllm/test_agent_clients.py,
docs/agents.md) need two things the tier's model (scripts/realvllm_model.py) does
not give them:

* **A window that holds Claude Code's prompt.** Its system prompt and first
  message are about 17 KB of text, some 13,000 tokens with the tiny byte-level
  tokenizer; the base model's 8,192 positions do not hold it. This one has
  :data:`WINDOW_TOKENS`.
* **Replies that end.** A random-weight model almost never emits its
  end-of-sequence token (about 1 in 1,024 a token), and a client cannot be
  made to stop it: Claude Code reports a reply cut at ``max_tokens`` as an
  error ("exceeded the output token maximum") and exits 1, whatever cap it
  sent. So the end-of-sequence token is made likely everywhere: one hidden
  dimension of every token's embedding is set to a constant (which the final
  norm carries through to the last hidden state), and the output head, untied
  from the embeddings, reads that dimension for end-of-sequence alone. Other
  tokens' logits are the base model's; a reply ends after about ten tokens
  (the build measures it and refuses a model whose replies would not end). Replies stay noise, and
  no tool call is ever parsed: every client takes the reply as its final
  answer.

Same tokenizer and chat template as the base model, so token counts mean the
same. Run with the vLLM environment's interpreter::

    .cache/vllm-venv/bin/python scripts/realvllm_agent_model.py \
        .cache/realvllm-model .cache/realvllm-agent-model
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

WINDOW_TOKENS = 65536
EOS_DIM = 0
"""The hidden dimension that carries the end-of-sequence signal."""
EOS_DIM_VALUE = 0.5
"""Set in every token's embedding: it dominates the residual's direction there."""
EOS_HEAD_WEIGHT = 1.6
"""The output head's weight on that dimension for end-of-sequence (about 1 in 10)."""
PROBES = [
    "hello world",
    "def add(a, b):\n    return a + b\n" * 40,
    "The quick brown fox jumps over the lazy dog. " * 200,
]


def derive(base: Path, out: Path) -> None:
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(base)
    model = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32)
    embed = model.get_input_embeddings().weight.data
    head = torch.nn.Linear(embed.shape[1], embed.shape[0], bias=False)
    head.weight.data = embed.clone()
    head.weight.data[:, EOS_DIM] = 0.0
    head.weight.data[tok.eos_token_id, EOS_DIM] = EOS_HEAD_WEIGHT
    embed[:, EOS_DIM] = EOS_DIM_VALUE
    model.config.tie_word_embeddings = False
    model.set_output_embeddings(head)
    model.config.max_position_embeddings = WINDOW_TOKENS
    p_eos = []
    for probe in PROBES:
        ids = tok(probe, return_tensors="pt").input_ids
        with torch.no_grad():
            logits = model(ids).logits[0]
        p_eos.append(torch.softmax(logits, -1)[:, tok.eos_token_id].mean().item())
    mean_p = sum(p_eos) / len(p_eos)
    if not 0.03 < mean_p < 0.5:
        raise SystemExit(f"end-of-sequence probability {mean_p:.3f} is off: replies would not end")
    model = model.to(torch.bfloat16)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save_pretrained(out)
    tok.model_max_length = WINDOW_TOKENS
    tok.save_pretrained(out)
    meta = json.loads((base / "kairos-model.json").read_text())
    meta.update(
        parameters=sum(p.numel() for p in model.parameters()),  # the head is its own now
        window_tokens=WINDOW_TOKENS,
        mean_eos_probability=round(mean_p, 4),
    )
    (out / "kairos-model.json").write_text(json.dumps(meta) + "\n")
    print(
        f"agent model: window {WINDOW_TOKENS} tokens, end-of-sequence "
        f"{mean_p:.3f} a token on average -> {out}"
    )


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: realvllm_agent_model.py BASE_MODEL_DIR OUT_DIR")
    derive(Path(sys.argv[1]), Path(sys.argv[2]))
