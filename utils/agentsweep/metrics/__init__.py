"""Engine metrics: the Prometheus scraper and the vLLM/SGLang dialect mapping (ARCHITECTURE.md §6)."""
