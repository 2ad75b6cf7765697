"""The accuracy gate: an engine's answers scored by a maintained evaluation harness (lm-evaluation-harness,
in a virtualenv of its own) against its own OpenAI-compatible API, so a fast configuration that answers
wrong is not a result (docs/accuracy.md)."""
