"""The trace library: loading, validation, prompt synthesis and cache analysis."""
