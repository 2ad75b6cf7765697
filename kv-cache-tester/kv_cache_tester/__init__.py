"""kv-cache-tester: replay agentic coding traces against an OpenAI-compatible server."""

__version__ = "0.1.0"
