"""Results that travel: a sweep's points as InferenceX agentic rows (docs/export.md)."""
