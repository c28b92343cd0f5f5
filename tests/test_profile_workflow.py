"""The `autolade profile` workflow as a library call (``autolade.tuning.profile_workflow``), without click;
the command itself is tested through click's CliRunner in test_cli_profiles.py."""

from __future__ import annotations

import pytest
from test_cli_profiles import tiny_model_dir
from test_tables import FLAT, FP, WINDOW, synthetic_table

from autolade.errors import ConfigError
from autolade.store.db import ProfileStore
from autolade.tuning.profile_workflow import profile_machine, store_prediction


class Hardware:
    """Just what a predicted profile reads of ``Hardware``."""

    fingerprint = "cpu:AMD-EPYC:t2:avx512_bf16"
    hardware_class = "cpu:AuthenticAMD:f26:avx512_bf16"

    def summary(self) -> str:
        return "a test machine"


def test_profile_machine_reports_through_echo_and_returns_what_it_stored(tmp_path, monkeypatch, one_thread):
    from autolade import api
    from autolade.machine.models import model_fingerprint
    from autolade.records.vocab import model_tokenizer_fingerprint

    monkeypatch.setenv("AUTOLADE_HOME", str(tmp_path / "home"))
    model_dir = tiny_model_dir(tmp_path / "tiny-llama")
    mdl, tok = api.load(str(model_dir))
    with ProfileStore() as store:
        store.save_acceptance(synthetic_table(model_fingerprint(mdl), model_tokenizer_fingerprint(mdl, tok)))
    out: list[str] = []
    err: list[str] = []
    run = profile_machine(model=str(model_dir), quick=True, plot=tmp_path / "curve.png", echo=out.append, log=err.append)
    text = "\n".join(out)
    assert err[0] == f"loading {model_dir} (float32)..." and "loading" not in text  # progress apart from the report
    assert any("measuring step-latency curve of tiny-llama" in e for e in err)
    assert "spare compute: k=" in text and f"saved step curve #{run.curve_id} to {run.store_path}" in text
    assert run.predicted == {"chat": 1} and "chat: stored predicted profile #1" in text
    assert "code: no acceptance table" in text
    assert run.recommended_dtype is None and "no bfloat16 step curve of this model on this machine yet" in run.dtype_why
    assert run.plot is not None and run.plot.read_bytes()[:4] == b"\x89PNG" and f"wrote {run.plot}" in text
    assert run.curve.dtype == "float32" and run.hardware.fingerprint.startswith("cpu:")
    with ProfileStore() as store:
        prof = store.get(1)
    assert prof.workload == "chat" and prof.notes.startswith("predicted") and prof.step_curve == run.curve.to_dict()


def test_a_negative_verify_is_refused_before_anything_loads():
    with pytest.raises(ConfigError, match="verify must be 0"):
        profile_machine(model="no-such-model", verify=-1, echo=lambda m: None)


@pytest.mark.parametrize("measured", [(0.9, 0.8), (1.4, 1.1)])
def test_verify_stores_the_prediction_only_when_it_beats_greedy(monkeypatch, measured):
    import autolade.tuning.verify as verify

    speedup, vs_pld = measured
    monkeypatch.setattr(verify, "measure_holdout", lambda *a, **k: measured)
    out: list[str] = []
    with ProfileStore(":memory:") as store:
        profile_id = store_prediction(store, None, None, table=synthetic_table(), source="store (chat, float32)", curve=FLAT,
                                      hardware=Hardware(), fingerprint=FP, workload="chat", verify=2, echo=out.append)
        prof = store.get(profile_id)
    assert f"verified on 2 held-out prompts: {WINDOW.label} {speedup:.2f}x greedy, {vs_pld:.2f}x HF prompt lookup" in out
    if speedup < 1.0:
        assert prof.settings.greedy_only and prof.speedup is None and prof.policy is None
        assert prof.notes.startswith(f"predicted setting {WINDOW.label} measured 0.90x greedy (< 1.0x): greedy stored.")
        assert out[-1] == f"chat: stored predicted profile #{profile_id} (greedy)"
    else:
        assert prof.settings == WINDOW.config and prof.speedup == pytest.approx(1.4)
        assert out[-1] == f"chat: stored predicted profile #{profile_id} ({WINDOW.label})"
