"""InferenceX's model keys (``infmax_model_prefix``) of the models this project ships configs for: the
export names a row's model by it, and the accuracy gate finds a model's own threshold by it."""

from __future__ import annotations

# By Hugging Face name. A model without an InferenceX key has none here: its config entry names one.
MODEL_PREFIXES: dict[str, str] = {
    "meta-llama/Llama-3.3-70B-Instruct": "llama70b",
    "nvidia/Llama-3.3-70B-Instruct-FP8": "llama70b",
    "deepseek-ai/DeepSeek-R1": "dsr1",
    "deepseek-ai/DeepSeek-R1-0528": "dsr1",
    "nvidia/DeepSeek-R1-0528-FP4-V2": "dsr1",
    "amd/DeepSeek-R1-0528-MXFP4-Preview": "dsr1",
    "Qwen/Qwen3.5-397B-A17B": "qwen3.5",
    "Qwen/Qwen3.5-397B-A17B-FP8": "qwen3.5",
    "openai/gpt-oss-120b": "gptoss",
}


def model_prefix(model: str, stated: str = "") -> str | None:
    """A model's InferenceX key: the one its config entry states, else the shipped map's (None: unmapped)."""
    return stated or MODEL_PREFIXES.get(model)
