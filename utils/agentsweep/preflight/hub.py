"""Model, traces and disk checks (Hugging Face cache and hub through huggingface_hub).

The model counts as present when the HF cache the cells use (the runner's ``hf_cache``, else
``HF_HUB_CACHE``/the default) holds a snapshot with its ``config.json``; otherwise the hub is asked
for it with the token the cells get (``HF_TOKEN``), which also gives its size. With
``HF_HUB_OFFLINE=1`` the hub is never asked. Free disk under the cache must hold what is still to be
downloaded plus a margin, and the results directory a margin of its own.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from agentsweep.preflight.report import Check, failed, passed, skipped

GIB = 1 << 30
MIN_FREE_GIB = 1.0  # kept free under the HF cache and the results directory beyond what is downloaded
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf", ".json", ".model", ".txt", ".py", ".tiktoken")


def hf_token(environ: Mapping[str, str]) -> str | None:
    return environ.get("HF_TOKEN") or environ.get("HUGGING_FACE_HUB_TOKEN") or None


def cache_dir(hf_cache: str | None, environ: Mapping[str, str]) -> Path:
    """The hub cache the cells read (what the launcher exports as HF_HUB_CACHE)."""
    if hf_cache:
        return Path(hf_cache)
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"])
    home = environ.get("HF_HOME") or str(
        Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    )
    return Path(home) / "hub"


def cached_repo(cache: Path, repo_id: str, repo_type: str = "model") -> tuple[bool, int]:
    """(a snapshot of ``repo_id`` is in ``cache``, bytes its blobs take); reads the cache layout."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound, CorruptedCacheException

    if not cache.is_dir():
        return False, 0
    try:
        info = scan_cache_dir(cache)
    except (CacheNotFound, CorruptedCacheException, OSError):
        return False, 0
    for repo in info.repos:
        if repo.repo_id == repo_id and repo.repo_type == repo_type and repo.revisions:
            marker = "config.json" if repo_type == "model" else ""
            complete = any(
                not marker or any(f.file_name == marker for f in rev.files) for rev in repo.revisions
            )
            return complete, int(repo.size_on_disk)
    return False, 0


def _hub_error(err: Exception, what: str, token: str | None, download: str) -> tuple[str, str]:
    """(detail, fix) for a hub failure; ``download`` is the command that fills the cache by hand."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    no_token = "" if token else " and no HF_TOKEN is set"
    if isinstance(err, GatedRepoError):
        return (
            f"{what} is gated{no_token}",
            "set the HF_TOKEN secret (a token whose account accepted the model's terms)",
        )
    if isinstance(err, RepositoryNotFoundError):
        return (
            f"the hub has no {what} (or it is private{no_token})",
            "correct the name in the config entry, or set HF_TOKEN for a private repository",
        )
    return (
        f"the hub cannot be asked about {what} ({type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}){no_token}",
        f"download it into the runner's hf_cache beforehand (`{download}`), or set HF_TOKEN and let this host reach the hub",
    )


def model_check(model: str, hf_cache: str | None, environ: Mapping[str, str]) -> tuple[Check, int]:
    """The model is in the cache or downloadable; also the bytes still to download (0 when unknown)."""
    name = "model"
    cache = cache_dir(hf_cache, environ)
    present, size = cached_repo(cache, model)
    if not cache.is_dir():
        return failed(
            name,
            f"the HF cache {cache} does not exist on this host",
            "create it on a filesystem the nodes see, or set hf_cache of the runner in configs/runners.yaml",
        ), 0
    if present:
        return passed(name, f"{model} is in the HF cache {cache} ({size / GIB:.1f} GiB)"), 0
    token = hf_token(environ)
    if environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return failed(
            name,
            f"{model} is not in the HF cache {cache} and HF_HUB_OFFLINE is set",
            f"download it once: hf download {model} --cache-dir {cache}",
        ), 0
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=environ.get("HF_ENDPOINT") or None).model_info(
            model, files_metadata=True, token=token or False
        )
    except Exception as err:  # every hub failure (HTTP, network, auth) is a line, never a traceback
        detail, fix = _hub_error(err, model, token, f"hf download {model} --cache-dir {cache}")
        return failed(name, f"not in the HF cache {cache}; {detail}", fix), 0
    need = sum(int(s.size or 0) for s in info.siblings or [] if s.rfilename.endswith(WEIGHT_SUFFIXES))
    gated = f", gated: {info.gated}" if getattr(info, "gated", False) else ""
    return passed(name, f"{model} downloadable ({need / GIB:.1f} GiB{gated}; not yet in {cache})"), need


def traces_check(traces: str, hf_cache: str | None, environ: Mapping[str, str], repo: Path) -> Check:
    """A trace directory or file exists (relative paths mean the repository), or the HF dataset does."""
    name = "traces"
    if traces.startswith("hf:"):
        dataset = traces[3:]
        cache = cache_dir(hf_cache, environ)
        present, size = cached_repo(cache, dataset, "dataset")
        if present:
            return passed(name, f"dataset {dataset} is in the HF cache {cache} ({size / GIB:.2f} GiB)")
        if environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
            return failed(
                name,
                f"dataset {dataset} is not in {cache} and HF_HUB_OFFLINE is set",
                f"download it once: hf download {dataset} --repo-type dataset --cache-dir {cache}",
            )
        from huggingface_hub import HfApi

        token = hf_token(environ)
        try:
            HfApi(endpoint=environ.get("HF_ENDPOINT") or None).dataset_info(dataset, token=token or False)
        except Exception as err:  # as for the model: one line
            get = f"hf download {dataset} --repo-type dataset --cache-dir {cache}"
            detail, fix = _hub_error(err, f"dataset {dataset}", token, get)
            return failed(name, detail, fix)
        return passed(name, f"dataset {dataset} downloadable (not yet in {cache})")
    path = Path(traces) if Path(traces).is_absolute() else repo / traces
    if path.is_file():
        return passed(name, f"{traces} is a file ({path.stat().st_size} bytes)")
    if path.is_dir():
        count = sum(1 for p in path.iterdir() if p.suffix in (".json", ".jsonl", ".parquet"))
        if count:
            return passed(name, f"{traces}: {count} trace files")
        return failed(
            name,
            f"{traces} holds no .json/.jsonl/.parquet trace files",
            "point traces: at a directory of traces",
        )
    return failed(
        name,
        f"{traces} does not exist (looked at {path})",
        "correct traces: in the config entry, or copy the traces there (a path on a filesystem the nodes see)",
    )


def traces_fit_check(traces: str, max_context: int, repo: Path) -> Check:
    """The requests of local traces that fit ``max_context``, loaded and cut as the replayer cuts them
    (``--max-context``, truncate mode: a trace keeps its turns up to the first longer one); none left
    fails, as the replayer would refuse to start."""
    name = "traces.max_context"
    if traces.startswith("hf:"):
        return skipped(name, f"{traces}: a dataset is cut when a cell loads it (max_context {max_context})")
    from kv_cache_tester.errors import KVTesterError
    from kv_cache_tester.traces.loaders import load_traces

    path = Path(traces) if Path(traces).is_absolute() else repo / traces
    try:
        loaded = load_traces(path, max_context=max_context, max_context_mode="truncate", min_requests=1)
    except KVTesterError as err:
        return failed(
            name,
            f"max_context {max_context}: {err}",
            "raise replay.max_context in the config entry to hold at least one request of the traces",
        )
    kept = sum(t.num_requests for t in loaded.traces)
    return passed(
        name, f"{traces}: {kept} requests of {len(loaded.traces)} traces fit max_context {max_context}"
    )


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def disk_check(name: str, path: Path, need_bytes: int, what: str) -> Check:
    """Free space at ``path`` (or its nearest existing parent) holds ``need_bytes`` plus the margin."""
    where = _existing(path)
    free = shutil.disk_usage(where).free
    want = need_bytes + int(MIN_FREE_GIB * GIB)
    text = f"{free / GIB:.1f} GiB free at {where}, {what} need {want / GIB:.1f} GiB"
    if free < want:
        return failed(
            name, text, f"free space under {where} (or move it: hf_cache in configs/runners.yaml, RESULT_DIR)"
        )
    return passed(name, text)


def results_root(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("RESULT_DIR") or Path(os.getcwd()) / "results")


__all__ = [
    "cache_dir",
    "cached_repo",
    "disk_check",
    "model_check",
    "results_root",
    "skipped",
    "traces_check",
    "traces_fit_check",
]
