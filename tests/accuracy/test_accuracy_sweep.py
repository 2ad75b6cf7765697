"""The accuracy gate as a step of real cells: a sweep of two ``engine: vllm`` keys (``fake_vllm.py``:
the simulated engine behind a stand-in answering 95% and 60% of the questions right) through the real
local launcher, the real harness, collect, the store and the export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
from agentsweep.accuracy.harness import read_answers
from agentsweep.store import query
from agentsweep.store.db import Store

from tests.accuracy.conftest import write_questions

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "agentsweep.cli"]
QUESTIONS = 30


def tiny_tokenizer(directory: Path) -> Path:
    """A model directory: a byte-level BPE tokenizer.json trained here (a real engine's cell tokenizes
    its prompts with the model's tokenizer) and a 1B model's config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory.mkdir(parents=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    tokenizer.train_from_iterator(
        [p.read_text(errors="replace") for p in sorted(stdlib.glob("*.py"))[:60]], trainer
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    # Llama 3.2 1B's shape: the simulated engine sizes its weights and KV cache from it.
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "intermediate_size": 8192, "vocab_size": 128256, "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
    }  # fmt: skip
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def entry(key: str, rate: float, data: Path, model: Path) -> str:
    return textwrap.dedent(
        f"""
        {key}:
          runner: local
          engine: vllm
          model: {model}
          precision: bf16
          image: vllm/vllm-openai:v0.11.0
          duration: 5
          traces: kv-cache-tester/sample_traces
          engine_env: {{STANDIN_DATA: "{data}", STANDIN_RATE: "{rate}"}}
          accuracy: {{limit: {QUESTIONS}, data: "{data}"}}
          replay: {{max_context: 24576, max_delay: 0.2}}
          validity: {{min_window_requests: 1, min_window_coverage: 0.3, max_dispatch_lag_p99_s: 2.0, max_client_cpu_share: 10}}
          search_space:
            tp1: {{users: [2], offload: [off]}}
        """
    )


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentsweep.accuracy.harness import default_venv

    if not (default_venv() / "bin" / "lm_eval").is_file():
        pytest.skip("lm-eval is not installed: run scripts/accuracy/setup_venv.sh")
    root = tmp_path_factory.mktemp("gate")
    data = write_questions(root / "data", test=QUESTIONS)
    config = root / "sweep.yaml"
    model = tiny_tokenizer(root / "tiny-1B")
    config.write_text(entry("right95", 0.95, data, model) + entry("right60", 0.60, data, model))
    bin_dir = root / "bin"
    bin_dir.mkdir()
    vllm = bin_dir / "vllm"
    vllm.write_text(f"#!{sys.executable}\n" + (Path(__file__).parent / "fake_vllm.py").read_text())
    vllm.chmod(0o755)
    (bin_dir / "standin.py").write_text((Path(__file__).parent / "standin.py").read_text())
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    results = root / "results"
    proc = subprocess.run(
        [*CLI, "sweep", "--key", "right95", "--key", "right60", "--config", str(config), "--results", str(results),
         "--no-plots"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    # Exit 3: every cell ran, one is INVALID.
    assert proc.returncode == 3, proc.stdout[-4000:] + proc.stderr[-4000:]
    return results


def _cell_dir(results: Path, key: str) -> Path:
    (found,) = [p for p in (results / key).iterdir() if p.is_dir() and p.name.startswith(f"{key}-")]
    return found


def test_the_95_percent_cell_succeeds_with_its_score_and_the_60_percent_cell_is_invalid(swept):
    good, bad = _cell_dir(swept, "right95"), _cell_dir(swept, "right60")
    assert (good / "status.txt").read_text().splitlines() == ["SUCCESS"]
    status = (bad / "status.txt").read_text().splitlines()
    assert status[0] == "INVALID"
    (reason,) = [line for line in status[1:] if line.startswith("accuracy: ")]
    assert reason.startswith("accuracy: gsm8k 0.") and f"< 0.90 over {QUESTIONS} questions, 95% CI" in reason
    for path, outcome in ((good, "passed"), (bad, "failed")):
        record = json.loads((path / "accuracy.json").read_text())
        assert record["outcome"] == outcome and record["questions"] == QUESTIONS
        assert len(read_answers(path)) == QUESTIONS
        summary = json.loads((path / "summary.json").read_text())
        assert summary["accuracy"]["score"] == record["score"]
        assert summary["validity"]["checks"]["accuracy"]["ok"] is (outcome == "passed")
    # The gate's requests are in neither the replay's records nor its window.
    records = [json.loads(line) for line in (good / "requests.jsonl").read_text().splitlines()]
    assert records and not any("Question:" in json.dumps(r) for r in records)


def test_the_report_and_the_table_carry_the_scores(swept):
    for key, outcome in (("right95", "passed"), ("right60", "failed")):
        table = (swept / key / "aggregated" / "summary.csv").read_text()
        assert "accuracy_score" in table.splitlines()[0] and f",{outcome}," in table
        report = (swept / key / "aggregated" / "report.html").read_text()
        assert "Accuracy gate" in report and outcome in report
    # The INVALID cell's reason, on the report's first screen.
    assert "accuracy: gsm8k 0." in (swept / "right60" / "aggregated" / "report.html").read_text()


def test_the_store_keeps_the_scores(swept, tmp_path):
    db = tmp_path / "store.db"
    proc = subprocess.run(
        [*CLI, "results", "ingest", "--db", str(db), str(swept)], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    store = Store.open(str(db))
    with store.read() as conn:
        points = {p.config_key: p for p in query.load_points(conn)}
    store.dispose()
    assert points["right95"].metrics["accuracy_score"] >= 0.90 > points["right60"].metrics["accuracy_score"]
    assert points["right60"].status == "INVALID"


def test_the_export_writes_the_scores_as_inferencex_eval_results(swept, tmp_path):
    out = tmp_path / "export"
    proc = subprocess.run(
        [*CLI, "export", "--format", "inferencex", str(swept), "-o", str(out), "--include-invalid",
         "--allow-unmapped"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    for key in ("right95", "right60"):
        (folder,) = [p for p in out.iterdir() if p.name.startswith(f"eval_{key}")]
        results = json.loads((folder / "results_gsm8k.json").read_text())
        score = results["results"]["gsm8k"]["exact_match,strict-match"]
        record = json.loads((_cell_dir(swept, key) / "accuracy.json").read_text())
        assert score == record["score"] and results["n-samples"]["gsm8k"]["effective"] == QUESTIONS
        meta = json.loads((folder / "meta_env.json").read_text())
        assert meta["outcome"] == record["outcome"] and meta["simulated"] is False
