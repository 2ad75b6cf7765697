"""Run GitHub Actions workflow jobs from the workflow files themselves, on this machine.

The tests never retype a workflow's commands: they load .github/workflows/*.yml, evaluate the
`${{ }}` expressions a job uses (a small evaluator for the subset these workflows use; anything
else fails the test), and run each `run:` step with bash the way the runner does
(`bash --noprofile --norc -eo pipefail`), with GITHUB_OUTPUT / GITHUB_STEP_SUMMARY files and the
step's `env:`. Steps that `uses:` an action go to handlers the test supplies (checkout and the
setup action are no-ops here: the workspace links to this checkout and its virtualenv).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / ".github" / "workflows"
VENV = Path(sys.prefix) if sys.prefix != sys.base_prefix else REPO / ".venv"


# --------------------------------------------------------------------------------------------------
# workflow files


def load_workflow(name: str) -> dict[str, Any]:
    """A workflow as a dict; PyYAML reads the key `on` as True, so it is put back under "on"."""
    data = yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))
    if True in data:
        data["on"] = data.pop(True)
    return data


def job_steps(workflow: Mapping[str, Any], job: str) -> list[dict[str, Any]]:
    return list(workflow["jobs"][job].get("steps", []))


# --------------------------------------------------------------------------------------------------
# expressions: ${{ ... }}

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d+)?)|(?P<str>'(?:[^']|'')*')|(?P<op>&&|\|\||==|!=|<=|>=|[<>!()\[\].,])"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_-]*))"
)
_EXPR = re.compile(r"\$\{\{(.*?)\}\}", re.S)
_WHOLE = re.compile(r"\$\{\{((?:(?!\}\}).)*)\}\}", re.S)


class ExprError(Exception):
    """An expression outside the subset this evaluator knows."""


def _truthy(value: Any) -> bool:
    return value not in (None, False, 0, "") and value == value  # NaN is falsy too


def to_text(value: Any) -> str:
    """How GitHub turns an expression result into a string (env values, interpolation)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, dict | list):
        return json.dumps(value, indent=2)
    return str(value)


class _Parser:
    def __init__(self, text: str, ctx: Mapping[str, Any]) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        text = text.strip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise ExprError(f"cannot tokenize {text[pos:]!r}")
            kind = m.lastgroup or ""
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0
        self.ctx = ctx

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value):
            raise ExprError(f"expected {value!r}, got {tok!r}")
        self.i += 1
        return tok

    def parse(self) -> Any:
        value = self.or_()
        if self.peek() is not None:
            raise ExprError(f"unexpected {self.peek()!r}")
        return value

    def or_(self) -> Any:
        value = self.and_()
        while self.peek() == ("op", "||"):
            self.take()
            right = self.and_()
            value = value if _truthy(value) else right
        return value

    def and_(self) -> Any:
        value = self.cmp()
        while self.peek() == ("op", "&&"):
            self.take()
            right = self.cmp()
            value = right if _truthy(value) else value
        return value

    def cmp(self) -> Any:
        left = self.unary()
        tok = self.peek()
        if tok and tok[1] in ("==", "!=", "<", ">", "<=", ">="):
            self.take()
            right = self.unary()
            ops: dict[str, Callable[[Any, Any], bool]] = {
                "==": lambda a, b: a == b,
                "!=": lambda a, b: a != b,
                "<": lambda a, b: a < b,
                ">": lambda a, b: a > b,
                "<=": lambda a, b: a <= b,
                ">=": lambda a, b: a >= b,
            }
            return ops[tok[1]](left, right)
        return left

    def unary(self) -> Any:
        if self.peek() == ("op", "!"):
            self.take()
            return not _truthy(self.unary())
        return self.postfix()

    def postfix(self) -> Any:
        value = self.primary()
        while True:
            tok = self.peek()
            if tok == ("op", "."):
                self.take()
                value = self._index(value, self.take()[1])
            elif tok == ("op", "["):
                self.take()
                key = self.or_()
                self.take("]")
                value = self._index(value, key)
            else:
                return value

    @staticmethod
    def _index(value: Any, key: Any) -> Any:
        if isinstance(value, dict):
            return value.get(key)
        if isinstance(value, list) and isinstance(key, int | float):
            return value[int(key)] if 0 <= int(key) < len(value) else None
        return None

    def primary(self) -> Any:
        kind, text = self.take()
        if kind == "num":
            return float(text) if "." in text else int(text)
        if kind == "str":
            return text[1:-1].replace("''", "'")
        if text == "(":
            value = self.or_()
            self.take(")")
            return value
        if kind != "name":
            raise ExprError(f"unexpected {text!r}")
        if text in ("true", "false"):
            return text == "true"
        if text == "null":
            return None
        if self.peek() == ("op", "("):
            self.take()
            args = []
            while self.peek() != ("op", ")"):
                args.append(self.or_())
                if self.peek() == ("op", ","):
                    self.take()
            self.take(")")
            return self._call(text, args)
        if text not in self.ctx:
            raise ExprError(f"context {text!r} is not available here")
        return self.ctx[text]

    def _call(self, name: str, args: list[Any]) -> Any:
        status = self.ctx.get("__status__", "success")
        if name == "fromJSON":
            return json.loads(args[0])
        if name == "toJSON":
            return json.dumps(args[0], indent=2)
        if name == "always":
            return True
        if name == "cancelled":
            return False
        if name == "success":
            return status == "success"
        if name == "failure":
            return status == "failure"
        raise ExprError(f"function {name}() is not supported by this evaluator")


def evaluate(expr: str, ctx: Mapping[str, Any]) -> Any:
    """Evaluate one expression (the text inside ${{ }}) against the contexts in ctx."""
    return _Parser(expr, ctx).parse()


def render(value: Any, ctx: Mapping[str, Any]) -> Any:
    """A YAML value with its ${{ }} expressions evaluated: one whole expression keeps its type."""
    if not isinstance(value, str):
        return value
    whole = _WHOLE.fullmatch(value.strip())
    if whole:
        return evaluate(whole.group(1), ctx)
    return _EXPR.sub(lambda m: to_text(evaluate(m.group(1), ctx)), value)


def condition(value: Any, ctx: Mapping[str, Any]) -> bool:
    """A step/job `if:` (bare or wrapped in ${{ }})."""
    if value is None:
        return evaluate("success()", ctx)
    text = str(value).strip()
    whole = _WHOLE.fullmatch(text)
    return _truthy(evaluate(whole.group(1) if whole else text, ctx))


# --------------------------------------------------------------------------------------------------
# running a job


@dataclass
class StepResult:
    name: str
    ran: bool
    returncode: int = 0
    output: str = ""
    outputs: dict[str, str] = field(default_factory=dict)


@dataclass
class JobResult:
    steps: list[StepResult]
    outputs: dict[str, Any]
    summary: str
    status: str

    def step(self, name: str) -> StepResult:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"no step named {name!r}; steps: {[s.name for s in self.steps]}")


def parse_output_file(text: str) -> dict[str, str]:
    """$GITHUB_OUTPUT syntax: `name=value` lines and `name<<DELIM` ... `DELIM` blocks."""
    out: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            body = []
            i += 1
            while lines[i] != delim:
                body.append(lines[i])
                i += 1
            out[name] = "\n".join(body)
        elif "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
        elif line.strip():
            raise ValueError(f"malformed GITHUB_OUTPUT line: {line!r}")
        i += 1
    return out


UsesHandler = Callable[[dict[str, Any], Mapping[str, Any]], None]


def action_name(uses: str) -> str:
    """`actions/checkout@<sha>` -> `actions/checkout`; `$/.github/actions/setup` stays as it is."""
    return uses.split("@", 1)[0]


def run_job(
    workflow: Mapping[str, Any],
    job_id: str,
    ctx: Mapping[str, Any],
    workspace: Path,
    temp: Path,
    uses: Mapping[str, UsesHandler],
    timeout: float = 120,
) -> JobResult:
    """Run a job's steps in order as the runner would; `uses` maps action names to handlers."""
    job = workflow["jobs"][job_id]
    shell = workflow.get("defaults", {}).get("run", {}).get("shell", "bash")
    assert shell == "bash", f"{job_id}: only bash steps are supported here, got {shell}"
    ctx = {**ctx, "runner": {"temp": str(temp), "os": "Linux"}, "steps": {}, "env": {}}
    ctx["github"] = {"workspace": str(workspace), **ctx.get("github", {})}
    ctx["github"]["workspace"] = str(workspace)
    env: dict[str, str] = {}
    for scope in (workflow.get("env", {}), job.get("env", {})):
        for name, value in scope.items():
            env[name] = to_text(render(value, {**ctx, "env": dict(env)}))
    status = "success"
    results: list[StepResult] = []
    summary_parts: list[str] = []
    for index, step in enumerate(job.get("steps", [])):
        name = step.get("name") or step.get("id") or f"step {index}"
        step_ctx = {**ctx, "env": dict(env), "__status__": status}
        if not condition(step.get("if"), step_ctx):
            results.append(StepResult(name, ran=False))
            continue
        step_env = dict(env)
        for var, value in step.get("env", {}).items():
            step_env[var] = to_text(render(value, step_ctx))
        if "uses" in step:
            handler = uses.get(action_name(step["uses"]))
            if handler is None:
                raise AssertionError(f"{job_id}/{name}: no handler for {step['uses']}")
            with_ = {k: render(v, {**step_ctx, "env": step_env}) for k, v in step.get("with", {}).items()}
            handler(with_, step_env)
            results.append(StepResult(name, ran=True))
            continue
        out_file = temp / f"output-{index}"
        summary_file = temp / f"summary-{index}"
        env_file = temp / f"env-{index}"
        out_file.write_text("")
        summary_file.write_text("")
        env_file.write_text("")
        script = temp / f"step-{index}.sh"
        script.write_text(step["run"])
        proc_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", str(temp)),
            "LANG": "C.UTF-8",
            "CI": "true",
            "GITHUB_ACTIONS": "true",
            "GITHUB_WORKSPACE": str(workspace),
            "RUNNER_TEMP": str(temp),
            "GITHUB_OUTPUT": str(out_file),
            "GITHUB_STEP_SUMMARY": str(summary_file),
            "GITHUB_ENV": str(env_file),
            **step_env,
        }
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            cwd=workspace,
            env=proc_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        outputs = parse_output_file(out_file.read_text())
        env.update(parse_output_file(env_file.read_text()))  # $GITHUB_ENV: for the steps after this one
        if "id" in step:
            ctx["steps"][step["id"]] = {"outputs": outputs}
        summary_parts.append(summary_file.read_text())
        results.append(StepResult(name, True, proc.returncode, proc.stdout + proc.stderr, outputs))
        if proc.returncode != 0:
            status = "failure"
    out_ctx = {**ctx, "env": env}
    job_outputs = {k: render(v, out_ctx) for k, v in job.get("outputs", {}).items()}
    return JobResult(results, job_outputs, "".join(summary_parts), status)


def call_inputs(called: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The `inputs` context of a workflow_call: given values checked against the declared types."""
    declared = called["on"]["workflow_call"]["inputs"]
    unknown = set(given) - set(declared)
    assert not unknown, f"inputs not declared by the called workflow: {sorted(unknown)}"
    kinds = {"string": (str,), "number": (int, float), "boolean": (bool,)}
    out: dict[str, Any] = {}
    for name, spec in declared.items():
        if name not in given:
            assert not spec.get("required"), f"required input {name} not given"
            out[name] = spec.get("default")
            continue
        value = given[name]
        ok = isinstance(value, kinds[spec["type"]]) and not (
            spec["type"] == "number" and isinstance(value, bool)
        )
        assert ok, f"input {name}: declared {spec['type']}, given {value!r}"
        out[name] = value
    return out


def sweep_run(
    sweep_inputs: Mapping[str, Any],
    matrix_outputs: Mapping[str, Any],
    secrets: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """agentic-sweep.yml's `sweep` job after its matrix job: (the called agentic-sweep-run.yml, its
    `inputs` context, its secrets), rendered from the dispatch inputs and the matrix job's outputs."""
    call = load_workflow("agentic-sweep.yml")["jobs"]["sweep"]
    run_wf = load_workflow(call["uses"].removeprefix("$/.github/workflows/"))
    ctx = {
        "inputs": sweep_inputs,
        "needs": {"matrix": {"outputs": dict(matrix_outputs), "result": "success"}},
        "secrets": dict(secrets or {}),
    }
    given = {name: render(value, ctx) for name, value in call["with"].items()}
    passed = {name: render(value, ctx) for name, value in call["secrets"].items()}
    return run_wf, call_inputs(run_wf, given), passed


def dispatch_inputs(workflow: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The `inputs` context of a workflow_dispatch run: defaults filled in, types checked."""
    declared = workflow["on"]["workflow_dispatch"]["inputs"]
    unknown = set(given) - set(declared)
    assert not unknown, f"not inputs of the workflow: {sorted(unknown)}"
    out: dict[str, Any] = {}
    for name, spec in declared.items():
        value = given.get(name, spec.get("default"))
        if spec.get("required"):
            assert value not in (None, ""), f"required input {name} not given"
        kind = spec["type"]
        if kind == "choice":
            assert value in spec["options"], f"{name}: {value!r} is not one of {spec['options']}"
        elif kind == "number":
            assert isinstance(value, int | float) and not isinstance(value, bool), f"{name}: {value!r}"
        elif kind == "boolean":
            assert isinstance(value, bool), f"{name}: {value!r}"
        else:
            assert isinstance(value, str), f"{name}: {value!r}"
        out[name] = value
    return out


def make_workspace(path: Path) -> Path:
    """A runner workspace: links to this checkout's top-level entries and its virtualenv."""
    path.mkdir(parents=True, exist_ok=True)
    for entry in REPO.iterdir():
        hidden = entry.name.startswith(".") and entry.name not in (".github", ".ci")
        if hidden or entry.name in ("results", "aggregated"):
            continue
        (path / entry.name).symlink_to(entry)
    (path / ".venv").symlink_to(VENV)
    return path


@pytest.fixture(scope="session")
def gha() -> SimpleNamespace:
    """The helpers above, for the tests of this folder."""
    return SimpleNamespace(
        REPO=REPO,
        VENV=VENV,
        load_workflow=load_workflow,
        job_steps=job_steps,
        evaluate=evaluate,
        render=render,
        run_job=run_job,
        call_inputs=call_inputs,
        sweep_run=sweep_run,
        dispatch_inputs=dispatch_inputs,
        to_text=to_text,
        make_workspace=make_workspace,
        action_name=action_name,
        ExprError=ExprError,
    )
