"""LMCache agentic traces (parquet) -> mooncake_trace JSONL and kv-cache-tester traces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from agentsweep.errors import InputError  # noqa: E402
from agentsweep.experimental.lmcache.convert import BlockHasher, convert, hf_tokenizer  # noqa: E402
from kv_cache_tester.traces import load_traces  # noqa: E402

FUNCTION = pa.struct([("name", pa.string()), ("arguments", pa.string())])
TOOL_CALL = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", FUNCTION)])
MESSAGE = pa.struct(
    [
        ("content", pa.string()),
        ("role", pa.string()),
        ("tool_calls", pa.list_(TOOL_CALL)),
        ("tool_call_id", pa.string()),
        ("name", pa.string()),
    ]
)


def msg(role: str, content: str | None, **extra) -> dict:
    return {"role": role, "content": content, "tool_calls": None, "tool_call_id": None, "name": None, **extra}


SYSTEM = msg("system", " ".join(f"rule{i}" for i in range(150)))
ASK_A = msg("user", "please fix the failing parser test")
CALL = msg(
    "assistant",
    None,
    tool_calls=[
        {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": '{"q": "parse"}'}}
    ],
)
RESULT = msg("tool", " ".join(f"line{i}" for i in range(90)), tool_call_id="c1", name="grep")
ASK_B = msg("user", "summarize the repository layout and list every module with its purpose")


def write_fixture(path: Path, *, rows: dict | None = None) -> Path:
    rows = rows or {
        "session_id": ["a", "b", "a"],
        "model": ["m1", "m1", "m1"],
        "input": [[SYSTEM, ASK_A], [SYSTEM, ASK_B], [SYSTEM, ASK_A, CALL, RESULT]],
        "output_length": [12, 7, 30],
        "pre_gap": [0.0, 0.0, 2.5],
    }
    table = pa.table(
        {
            "session_id": pa.array(rows["session_id"]),
            "model": pa.array(rows["model"]),
            "input": pa.array(rows["input"], type=pa.list_(MESSAGE)),
            "output_length": pa.array(rows["output_length"], type=pa.int64()),
            "pre_gap": pa.array(rows["pre_gap"], type=pa.float64()),
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_mooncake_rows_strip_nulls_and_group_sessions(tmp_path):
    src = write_fixture(tmp_path / "shards" / "part-0.parquet")
    out = tmp_path / "mc.jsonl"
    report = convert(src.parent, mooncake_out=out, system_role="developer")
    rows = read_jsonl(out)
    assert report.sessions == 2 and report.rows == 3
    assert [r["session_id"] for r in rows] == ["a", "a", "b"]  # a session's turns stay together, in order
    assert "delay" not in rows[0] and rows[1]["delay"] == 2500 and rows[1]["output_length"] == 30
    roles = [m["role"] for m in rows[1]["messages"]]
    assert roles == ["developer", "user", "assistant", "tool"]
    for m in (m for r in rows for m in r["messages"]):
        assert None not in m.values()  # vLLM rejects null optional fields
    call = rows[1]["messages"][2]
    assert call["content"] == "" and call["tool_calls"][0]["function"]["name"] == "grep"
    assert "tool_call_id" not in call and rows[1]["messages"][3]["tool_call_id"] == "c1"
    assert "tool_calls" not in rows[1]["messages"][1]


def test_traces_replayable_with_shared_prefix_ids(tmp_path):
    src = write_fixture(tmp_path / "x.parquet")
    out = tmp_path / "traces.jsonl"
    report = convert(src, traces_out=out, block_size=16)
    loaded = load_traces(out)
    by_id = {t.trace_id: t for t in loaded.traces}
    a, b = by_id["a"], by_id["b"]
    assert a.hash_id_scope == "global" and a.block_size == 16
    # token counts: words of the rendered messages plus role markers and the generation prompt
    first = 1 + 150 + 1 + 6 + 1  # <|system|> + 150 words, <|user|> + 6 words, <|assistant|>
    assert a.requests[0].in_tokens == first
    second = first + (1 + 1 + 3) + (1 + 90 + 2)  # tool call: marker, name, 2 words of JSON; tool result
    assert a.requests[1].in_tokens == second
    assert [r.out_tokens for r in a.requests] == [12, 30]
    assert a.requests[1].think_time == 2.5 and a.requests[1].t == 2.5
    ids0, ids1 = a.requests[0].hash_ids, a.requests[1].hash_ids
    assert len(ids0) == first // 16 and len(ids1) == second // 16
    assert ids1[: len(ids0)] == ids0  # the next turn extends the previous prompt
    # the other session shares only the blocks fully inside the common system prompt
    shared = 151 // 16
    assert b.requests[0].hash_ids[:shared] == ids0[:shared]
    assert b.requests[0].hash_ids[shared] != ids1[shared]
    assert 0 < report.hit_blocks < report.total_blocks


def test_hasher_incremental_equals_fresh():
    """Reusing the previous turn's blocks gives the same ids as hashing the whole prompt again."""
    turns = [[SYSTEM, ASK_A], [SYSTEM, ASK_A, CALL, RESULT], [SYSTEM, ASK_B]]
    clean = [[{k: v for k, v in m.items() if v is not None} for m in t] for t in turns]
    inc = BlockHasher(8)
    got = [inc.request("s", t) for t in clean]
    for k, t in enumerate(clean):
        fresh = BlockHasher(8)
        for earlier in clean[:k]:  # same id numbering: the same blocks seen in the same order
            fresh.request(f"warm{len(earlier)}", earlier)
        assert fresh.request("other", t) == got[k]


def test_hf_tokenizer_counts(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "<|system|>": 1, "<|user|>": 2, "<|assistant|>": 3, "hello": 4}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    encode = hf_tokenizer(tmp_path)
    assert encode("hello <|user|> other") == [4, 2, 0]
    with pytest.raises(InputError, match=r"no tokenizer\.json"):
        hf_tokenizer(tmp_path / "missing")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentsweep.experimental.lmcache", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.integration
def test_cli_converts_and_reports(tmp_path):
    src = write_fixture(tmp_path / "x.parquet")
    res = run_cli(
        str(src), "--traces-out", str(tmp_path / "t.jsonl"), "--mooncake-out", str(tmp_path / "m.jsonl")
    )
    assert res.returncode == 0, res.stderr
    assert "2 sessions, 3 requests" in res.stdout
    assert len(read_jsonl(tmp_path / "m.jsonl")) == 3


@pytest.mark.integration
@pytest.mark.parametrize(
    ("setup", "expect"),
    [
        ("missing", "no such file"),
        ("not_parquet", "not a parquet file"),
        ("garbage", "not a readable parquet file"),
        ("no_column", "missing column(s) output_length"),
        ("bad_role", "input[1]: role"),
        ("negative", "output_length: must be a non-negative integer"),
    ],
)
def test_cli_bad_input_one_line_exit_2(tmp_path, setup, expect):
    path = tmp_path / "in.parquet"
    if setup == "not_parquet":
        path = tmp_path / "in.csv"
        path.write_text("a,b\n")
    elif setup == "garbage":
        path.write_bytes(b"PAR1 not really")
    elif setup == "no_column":
        pq.write_table(pa.table({"session_id": ["a"], "input": ['[{"role": "user", "content": "x"}]']}), path)
    elif setup in ("bad_role", "negative"):
        rows = {
            "session_id": ["a"],
            "model": ["m"],
            "input": [[SYSTEM, msg("robot" if setup == "bad_role" else "user", "hi")]],
            "output_length": [-1 if setup == "negative" else 5],
            "pre_gap": [0.0],
        }
        write_fixture(path, rows=rows)
    res = run_cli(str(path), "--traces-out", str(tmp_path / "t.jsonl"))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def test_json_string_input_column(tmp_path):
    """Some shards store the messages list as a JSON string: accepted the same way."""
    path = tmp_path / "s.parquet"
    messages = json.dumps(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    )
    pq.write_table(
        pa.table({"session_id": ["z"], "input": [messages], "output_length": [3], "pre_gap": [None]}), path
    )
    out = tmp_path / "m.jsonl"
    convert(path, mooncake_out=out)
    assert read_jsonl(out) == [
        {
            "session_id": "z",
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}],
            "output_length": 3,
        }
    ]
