"""The wheel ships the policy presets and the shared profiles: built, installed into a fresh venv
outside the checkout, and used from there (slow: builds a wheel and a venv, about 10 s)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "setup.py", "README.md", "autolade", "policies", "profiles", "custom_generate")  # what the wheel is built from

# Runs inside the venv, from a cwd outside the checkout: a shipped preset by name, the shipped
# profiles through the store's profile search, and a generate() on a tiny random model with both.
SNIPPET = """
import json, sys
from pathlib import Path
import torch
from transformers import LlamaConfig, LlamaForCausalLM
import autolade
from autolade import generate
from autolade.config import LookaheadConfig
from autolade.paths import repo_policies_dir, repo_profiles_dir
from autolade.runtime.policies import make_policy
from autolade.store.db import ProfileStore

shipped = json.loads((repo_profiles_dir() / "cpu-amd-epyc-2t-smollm2-135m-bf16-chat.json").read_text())
with ProfileStore(":memory:") as store:
    profile, source = store.find_profile(
        hardware_fingerprint="cpu:elsewhere:t1:avx2", hardware_class=shipped["hardware"]["class"],
        model_fingerprint="smollm2-135m:" + shipped["model"]["config_hash"], dtype="bfloat16", workload="chat")
policy = make_policy("adaptive-cpu", LookaheadConfig())
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, eos_token_id=None, bos_token_id=None, pad_token_id=None)
model = LlamaForCausalLM(cfg).eval()
ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]])
out = generate(model, ids, max_new_tokens=8, policy="adaptive-cpu")
import autolade.hf
dropin = model.generate(ids, max_new_tokens=8, custom_generate=autolade.hf.folder(), trust_remote_code=True)
json.dump({"autolade": autolade.__file__, "policies": str(repo_policies_dir()), "profiles": str(repo_profiles_dir()),
           "source": source, "settings_window": profile.settings.window if profile else None,
           "policy": type(policy).__name__, "new_tokens": out.stats.new_tokens, "folder": autolade.hf.folder(),
           "dropin_same": dropin.tolist() == out.sequences.tolist()}, sys.stdout)
"""


@pytest.mark.slow
def test_wheel_ships_presets_and_profiles(tmp_path):
    src = tmp_path / "src"  # a clean copy: no stale build/ of the checkout gets into the wheel
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
                   check=True, cwd=tmp_path)
    (wheel,) = dist.glob("autolade-*.whl")
    venv = tmp_path / "venv"
    # --without-pip: the venv's python runs this interpreter's pip, which installs into the venv
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], check=True, cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([str(python), "-c", SNIPPET], check=True, cwd=elsewhere, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AUTOLADE_HOME": str(tmp_path / "home")})
    got = json.loads(done.stdout)
    installed = venv.resolve()
    assert Path(got["autolade"]).resolve().is_relative_to(installed), got["autolade"]  # the wheel's, not the checkout's
    assert Path(got["policies"]).resolve().is_relative_to(installed) and got["policies"].endswith("_shipped/policies")
    assert Path(got["profiles"]).resolve().is_relative_to(installed) and got["profiles"].endswith("_shipped/profiles")
    assert got["source"] == "file:profiles/cpu-amd-epyc-2t-smollm2-135m-bf16-chat.json:nearest-hardware"
    shipped = json.loads((ROOT / "profiles" / "cpu-amd-epyc-2t-smollm2-135m-bf16-chat.json").read_text())
    assert got["settings_window"] == shipped["settings"]["window"]  # the wheel's copy of that shipped profile
    assert got["policy"] == "AdaptivePolicy" and got["new_tokens"] == 8
    # the custom_generate/ folder ships too: model.generate(custom_generate=autolade.hf.folder()) runs from the wheel
    assert Path(got["folder"]).resolve().is_relative_to(installed) and got["folder"].endswith("_shipped")
    assert got["dropin_same"]
    # every package of the checkout is in the wheel (a hand list once left autolade.bench out), and the
    # console script runs from the venv: the command group and the bench, which imports every layer below it
    import zipfile

    shipped_pkgs = {str(p.parent.relative_to(ROOT)).replace("/", ".") for p in (ROOT / "autolade").rglob("__init__.py")}
    in_wheel = {name.rsplit("/", 1)[0].replace("/", ".") for name in zipfile.ZipFile(wheel).namelist()
                if name.endswith("/__init__.py")}
    assert shipped_pkgs <= in_wheel, shipped_pkgs - in_wheel
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "AUTOLADE_HOME": str(tmp_path / "home")}
    for args in (["--help"], ["bench", "--help"], ["tune", "--help"], ["profile", "--help"]):
        shown = subprocess.run([str(venv / "bin" / "autolade"), *args], cwd=elsewhere, capture_output=True, text=True, env=env)
        assert shown.returncode == 0, (args, shown.stderr)
        assert "Usage: autolade" in shown.stdout
    assert "--sets" in shown.stdout or "--model" in shown.stdout
