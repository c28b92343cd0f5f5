"""The step types and the engine's import boundary."""

import ast
from pathlib import Path

import pytest

import autolade.engine
from autolade.config import LookaheadConfig
from autolade.engine import steps
from autolade.engine.steps import StaticPolicy, StepOutcome, StepPlan

ENGINE = Path(autolade.engine.__file__).parent
ALLOWED = ("autolade.engine", "autolade.config", "autolade.errors")


def _autolade_imports(path: Path) -> list[str]:
    """Every autolade module ``path`` imports, relative imports resolved against autolade.engine."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "autolade"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["autolade", "engine"][: 2 - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
                out += [module] if node.module else [f"{module}.{a.name}" for a in node.names]
            elif (node.module or "").split(".")[0] == "autolade":
                out.append(node.module)
    return out


def test_engine_imports_nothing_above_config_and_errors():
    files = sorted(ENGINE.glob("*.py"))
    assert {"decode.py", "steps.py", "prompt_lookup.py", "pool.py"} <= {f.name for f in files}
    seen = {f.name: _autolade_imports(f) for f in files}
    bad = {name: [m for m in mods if not any(m == a or m.startswith(a + ".") for a in ALLOWED)]
           for name, mods in seen.items()}
    assert {name: mods for name, mods in bad.items() if mods} == {}
    assert "autolade.config" in seen["steps.py"] and "autolade.engine.steps" in seen["decode.py"]


def test_import_walk_resolves_relative_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from ..policies import X\nfrom . import pool\nfrom .steps import StepPlan\nimport autolade.api\n")
    assert _autolade_imports(f) == ["autolade.policies", "autolade.engine.pool", "autolade.engine.steps", "autolade.api"]


def test_step_types_are_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        StepPlan(3, 3, 10, 2)
    plan = StepPlan(window=3, guesses=3, draft_len=10, drafts=2)
    assert plan.draft_lens == ()
    with pytest.raises(TypeError):
        StepOutcome(plan, 1, 0, 0, "none", 0.1, 0.1)
    out = StepOutcome(plan=plan, packed=1, window_tokens=0, accepted=0,
                      accepted_from="none", step_s=0.1, forward_s=0.1)
    assert (out.longest_draft, out.match_len) == (0, 0)
    with pytest.raises(AttributeError):
        plan.window = 4


def test_static_policy_plans_the_config_and_policies_reexports_the_engine_types():
    plan = StaticPolicy(LookaheadConfig(window=0, guesses=0, prompt_lookup=6, prompt_lookup_drafts=3)).plan()
    assert plan == StepPlan(window=0, guesses=0, draft_len=6, drafts=3)
    assert StaticPolicy(LookaheadConfig(window=4, ngram=3, guesses=2, prompt_lookup=0)).plan() == StepPlan(
        window=4, guesses=2, draft_len=0, drafts=0)
    for name in ("StepPlan", "StepOutcome", "Policy", "StaticPolicy"):
        assert getattr(autolade.runtime.policies, name) is getattr(steps, name)
