import gzip
import json
import random

import pytest
import torch

from autolade.errors import InputError, WorkloadError
from autolade.workloads import (
    GENERAL,
    Prompt,
    encode_prompt,
    infer_workload,
    load_workload,
    lookup_order,
    split_workload,
    workload_or_general,
    workload_tag,
)


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# --- built-ins ------------------------------------------------------------------------------


@pytest.mark.slow
def test_chat_is_mt_bench_first_turns():
    prompts = load_workload("chat")
    assert len(prompts) == 80 and len({p.id for p in prompts}) == 80
    assert all(p.kind == "chat" and p.source == "mt-bench" and p.text.strip() for p in prompts)
    assert prompts[0].id == "mt-bench/81" and prompts[0].text.startswith("Compose an engaging travel blog post")
    assert load_workload("mt-bench", limit=3) == prompts[:3]


@pytest.mark.slow
def test_code_is_humaneval_prompts():
    prompts = load_workload("code")
    assert len(prompts) == 164
    assert prompts[0] == Prompt("HumanEval/0", prompts[0].text, "humaneval", "code")
    assert prompts[0].text.startswith("from typing import List") and '"""' in prompts[0].text
    assert len(load_workload("humaneval", limit=5)) == 5


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_bad_limit(limit):
    with pytest.raises(WorkloadError, match="limit"):
        load_workload("chat", limit=limit)


# --- user files ----------------------------------------------------------------------------


def test_jsonl_fields_ids_and_kinds(tmp_path):
    path = write_jsonl(
        tmp_path / "mine.jsonl",
        [
            {"prompt": "first", "id": "a"},
            "",
            {"text": "second", "kind": "code"},
            {"turns": ["third", "follow-up"], "question_id": 7},
        ],
    )
    prompts = load_workload(str(path))
    assert [(p.id, p.text, p.kind) for p in prompts] == [
        ("a", "first", "chat"),
        ("mine.jsonl/3", "second", "code"),
        ("7", "third", "chat"),
    ]
    assert all(p.source == str(path) for p in prompts)


def test_jsonl_gz(tmp_path):
    path = tmp_path / "w.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(json.dumps({"prompt": "zipped"}) + "\n")
    assert [p.text for p in load_workload(str(path))] == ["zipped"]


def test_txt_blocks(tmp_path):
    path = tmp_path / "w.txt"
    path.write_text("\n\nOne line.\n\nTwo\nlines.\n   \n\n\nLast one\n")
    prompts = load_workload(str(path))
    assert [p.text for p in prompts] == ["One line.", "Two\nlines.", "Last one"]
    assert [p.id for p in prompts] == ["w.txt/1", "w.txt/2", "w.txt/3"]
    assert load_workload(str(path), limit=2) == prompts[:2]


@pytest.mark.parametrize(
    "name, content, match",
    [
        ("empty.jsonl", "", "holds no prompts"),
        ("blank.txt", "\n  \n\n", "holds no prompts"),
        ("bad.jsonl", '{"prompt": "ok"}\n{oops\n', "line 2: not valid JSON"),
        ("list.jsonl", "[1, 2]\n", "line 1: expected a JSON object"),
        ("nofield.jsonl", '{"question": "x"}\n', "no 'prompt', 'text' or 'turns' field"),
        ("emptyprompt.jsonl", '{"prompt": "  "}\n', "line 1: the prompt is empty"),
        ("kind.jsonl", '{"prompt": "x", "kind": "poem"}\n', "kind must be one of"),
        ("dupes.jsonl", '{"prompt": "x", "id": 1}\n{"prompt": "y", "id": 1}\n', "duplicate prompt ids"),
        ("data.csv", "prompt\nx\n", "unknown workload format"),
    ],
)
def test_bad_files(tmp_path, name, content, match):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(WorkloadError, match=match):
        load_workload(str(path))


def test_missing_or_unknown(tmp_path):
    with pytest.raises(WorkloadError, match="not a built-in"):
        load_workload("poetry")
    with pytest.raises(WorkloadError, match="no such file"):
        load_workload(str(tmp_path / "gone.jsonl"))
    with pytest.raises(WorkloadError, match="not a file"):
        load_workload(str(tmp_path))


def test_binary_file(tmp_path):
    path = tmp_path / "w.txt"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(WorkloadError, match="UTF-8"):
        load_workload(str(path))


@pytest.mark.parametrize("name, tag", [
    ("chat", "chat"), ("mt-bench", "chat"), ("mtbench", "chat"), ("MT_Bench", "chat"),
    ("code", "code"), ("humaneval", "code"), ("human-eval", "code"), ("HumanEval", "code"),
    ("data/my set.jsonl", "my-set"), ("/tmp/prompts.jsonl.gz", "prompts"), ("notes.v2.txt", "notes.v2"),
    ("general", "general"), ("", "custom"),
])
def test_workload_tag_is_one_name_per_workload(name, tag):
    assert workload_tag(name) == tag
    assert workload_tag(tag) == tag  # a tag is its own tag: normalising twice changes nothing


def test_aliases_load_the_builtin():
    assert load_workload("MTBench", limit=2) == load_workload("chat", limit=2)
    assert load_workload("human_eval", limit=2) == load_workload("code", limit=2)


# --- split --------------------------------------------------------------------------------


@pytest.mark.slow
def test_split_is_deterministic_disjoint_and_complete():
    prompts = load_workload("chat")
    tune, holdout = split_workload(prompts)
    assert (tune, holdout) == split_workload(prompts)
    assert len(holdout) == 24 and len(tune) == 56
    assert not {p.id for p in tune} & {p.id for p in holdout}
    assert sorted(tune + holdout, key=prompts.index) == prompts
    assert tune == [p for p in prompts if p in tune]  # input order kept
    shuffled = prompts[:]
    random.Random(1).shuffle(shuffled)
    assert {p.id for p in split_workload(shuffled)[1]} == {p.id for p in holdout}
    assert {p.id for p in split_workload(prompts, seed=1)[1]} != {p.id for p in holdout}


@pytest.mark.slow
def test_split_edges():
    prompts = load_workload("code", limit=2)
    assert [len(side) for side in split_workload(prompts)] == [1, 1]
    assert split_workload(prompts[:1]) == (prompts[:1], [])
    assert split_workload(prompts, holdout_fraction=0.0) == (prompts, [])
    assert split_workload([]) == ([], [])
    for bad in (-0.1, 1.0):
        with pytest.raises(WorkloadError, match="holdout_fraction"):
            split_workload(prompts, holdout_fraction=bad)
    with pytest.raises(WorkloadError, match="unique"):
        split_workload([prompts[0], prompts[0]])


# --- encoding -----------------------------------------------------------------------------


@pytest.mark.slow
def test_encode_chat_uses_the_template(smollm2):
    _, tok = smollm2
    ids = encode_prompt(tok, "Hello there")
    assert ids.dtype == torch.long and ids.dim() == 2 and ids.shape[0] == 1
    text = tok.decode(ids[0])
    assert text.startswith("<|im_start|>system\n") and text.endswith("Hello there<|im_end|>\n<|im_start|>assistant\n")
    assert text.count("<|im_start|>") == 3  # the template's own tokens, none added twice


@pytest.mark.slow
def test_encode_raw_and_code(smollm2):
    _, tok = smollm2
    raw = encode_prompt(tok, "def f(x):", raw=True)
    assert raw.tolist() == [tok("def f(x):").input_ids]
    assert torch.equal(encode_prompt(tok, "def f(x):", kind="code"), raw)


@pytest.mark.slow
def test_encode_without_template_is_raw_with_bos(gemma3):
    _, tok = gemma3
    ids = encode_prompt(tok, "Hello there")
    assert ids[0, 0].item() == tok.bos_token_id
    assert ids.tolist() == [tok("Hello there").input_ids]


@pytest.mark.slow
@pytest.mark.parametrize("text", ["", "   \n\t", None])
def test_encode_empty_prompt(smollm2, text):
    with pytest.raises(InputError, match="empty"):
        encode_prompt(smollm2[1], text)


@pytest.mark.slow
def test_encode_bad_kind(smollm2):
    with pytest.raises(InputError, match="chat, code"):
        encode_prompt(smollm2[1], "hi", kind="poem")


@pytest.mark.parametrize("text, workload", [
    ("def f(x):\n    return x + 1\n", "code"),
    ("Write a Python function that checks whether a number is prime.", "code"),
    ("Please fix this SQL query: select * form t", "code"),
    ("Explain recursion to a child.", "chat"),
    ("Write a persuasive essay about city parks.", "chat"),
])
def test_infer_workload_from_the_prompt(text, workload):
    assert infer_workload(text) == workload


def test_no_workload_is_general_and_lookups_try_it_first():
    assert workload_or_general(None) == workload_or_general("") == GENERAL == "general"
    assert workload_or_general("HumanEval") == "code"
    assert lookup_order(None) == ["general", "chat", "code"]
    assert lookup_order("mtbench") == ["chat", "general", "code"]
    assert lookup_order("data/my-set.jsonl") == ["my-set", "general", "chat", "code"]
