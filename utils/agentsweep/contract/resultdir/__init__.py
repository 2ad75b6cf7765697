"""The cell result directory (ARCHITECTURE.md §3): every file it may hold, with its one writer and reader.

- ``files``: the declaration (``RESULT_FILES``: name, meaning, owner, size limit) and the file names.
- ``record``: cell.json (``CellRecord``), ``write_cell_result`` (cell.json then status.txt).
- ``status``: status.txt (``CellStatus``).
- ``router``: router.json (``RouterRecord``).
- ``capacity``: capacity.json (``CapacityRecord``) of a capacity cell, and its ``steps/<n>/``.
- ``matrix``: the matrix JSON collect and the workflow read beside the result directories.

requests.jsonl and summary.json are the replayer's (``kv_cache_tester.replay.results``); the
server_metrics*.csv files are read beside their columns (``agentsweep.metrics.scrapes``); power.csv
beside its writer (``agentsweep.energy.powercsv``); receipt.json, written last over every other file, is
``agentsweep.contract.receipt``'s.

Each ``read_*`` returns None when its file is absent and raises ``ResultFileError`` (``<file>: <field>:
<what>``, exit status 2) when the file breaks its contract; none blocks on a FIFO or reads past the
file's declared size.
"""

from typing import TYPE_CHECKING

from agentsweep.contract.lazy import lazy_exports

if TYPE_CHECKING:
    from agentsweep.contract.resultdir.capacity import (
        STOP_REASONS,
        CapacityRecord,
        CliffRecord,
        StepRecord,
        TierResult,
        read_capacity,
        step_dir,
        write_capacity,
    )
    from agentsweep.contract.resultdir.fileio import write_atomic
    from agentsweep.contract.resultdir.files import (
        ACCURACY_JSON,
        ACCURACY_JSONL,
        CAPACITY_JSON,
        CAPACITY_JSON_MAX_BYTES,
        CELL_JSON,
        CELL_JSON_MAX_BYTES,
        CLIENTS_DIR,
        MATRIX_MAX_BYTES,
        POWER_CSV,
        PREFILL_METRICS_CSV,
        RECEIPT_JSON,
        RECEIPT_JSON_MAX_BYTES,
        REQUESTS_JSONL,
        RESULT_FILES,
        ROUTER_JSON,
        ROUTER_JSON_MAX_BYTES,
        ROUTER_METRICS_CSV,
        ROUTER_METRICS_TXT,
        ROUTER_METRICS_TXT_MAX_BYTES,
        SERVER_LOG,
        SERVER_METRICS_CSV,
        STATUS_TXT,
        STATUS_TXT_MAX_BYTES,
        STEPS_DIR,
        SUMMARY_JSON,
        ResultFile,
        instance_log,
        instance_metrics_csv,
        result_file,
    )
    from agentsweep.contract.resultdir.matrix import matrix_json, read_matrix, read_matrix_entries
    from agentsweep.contract.resultdir.record import (
        CellRecord,
        read_cell_record,
        write_cell_record,
        write_cell_result,
    )
    from agentsweep.contract.resultdir.router import RouterRecord, read_router, write_router
    from agentsweep.contract.resultdir.status import CellStatus, read_status, write_status

__all__ = [
    "ACCURACY_JSON",
    "ACCURACY_JSONL",
    "CAPACITY_JSON",
    "CAPACITY_JSON_MAX_BYTES",
    "CELL_JSON",
    "CELL_JSON_MAX_BYTES",
    "CLIENTS_DIR",
    "MATRIX_MAX_BYTES",
    "POWER_CSV",
    "PREFILL_METRICS_CSV",
    "RECEIPT_JSON",
    "RECEIPT_JSON_MAX_BYTES",
    "REQUESTS_JSONL",
    "RESULT_FILES",
    "ROUTER_JSON",
    "ROUTER_JSON_MAX_BYTES",
    "ROUTER_METRICS_CSV",
    "ROUTER_METRICS_TXT",
    "ROUTER_METRICS_TXT_MAX_BYTES",
    "SERVER_LOG",
    "SERVER_METRICS_CSV",
    "STATUS_TXT",
    "STATUS_TXT_MAX_BYTES",
    "STEPS_DIR",
    "STOP_REASONS",
    "SUMMARY_JSON",
    "CapacityRecord",
    "CellRecord",
    "CellStatus",
    "CliffRecord",
    "ResultFile",
    "RouterRecord",
    "StepRecord",
    "TierResult",
    "instance_log",
    "instance_metrics_csv",
    "matrix_json",
    "read_capacity",
    "read_cell_record",
    "read_matrix",
    "read_matrix_entries",
    "read_router",
    "read_status",
    "result_file",
    "step_dir",
    "write_atomic",
    "write_capacity",
    "write_cell_record",
    "write_cell_result",
    "write_router",
    "write_status",
]

# Imported on first use (contract.lazy), from the first of these modules that has the name: a
# process may need one light module of this package only.
__getattr__ = lazy_exports(
    __name__,
    __all__,
    (
        "agentsweep.contract.resultdir.files",
        "agentsweep.contract.resultdir.fileio",
        "agentsweep.contract.resultdir.status",
        "agentsweep.contract.resultdir.matrix",
        "agentsweep.contract.resultdir.router",
        "agentsweep.contract.resultdir.capacity",
        "agentsweep.contract.resultdir.record",
    ),
    globals(),
)
