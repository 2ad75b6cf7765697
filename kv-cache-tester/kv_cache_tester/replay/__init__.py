"""The trace replayer. Its public surface is what other code may import from here: the typed output
files (requests.jsonl records, summary.json) with their readers, and the summary builder that turns
records from any client into the same summary.json. Everything else in the subpackage is internal.
"""

from kv_cache_tester.replay.results import (
    REQUESTS_FILE,
    SCHEMA_VERSION,
    SUMMARY_FILE,
    Cache,
    Counts,
    DispatchLag,
    ItlSummary,
    Latency,
    RequestError,
    RequestRecord,
    ResultError,
    SelfAudit,
    Slo,
    Summary,
    Throughput,
    Window,
    itl_summary,
    read_record,
    read_summary,
)
from kv_cache_tester.replay.summary import RunMeta, build_summary, read_records, write_summary

__all__ = [
    "REQUESTS_FILE",
    "SCHEMA_VERSION",
    "SUMMARY_FILE",
    "Cache",
    "Counts",
    "DispatchLag",
    "ItlSummary",
    "Latency",
    "RequestError",
    "RequestRecord",
    "ResultError",
    "RunMeta",
    "SelfAudit",
    "Slo",
    "Summary",
    "Throughput",
    "Window",
    "build_summary",
    "itl_summary",
    "read_record",
    "read_records",
    "read_summary",
    "write_summary",
]
