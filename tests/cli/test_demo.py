import pytest

pytestmark = pytest.mark.slow


def test_demo_on_smollm2_reduced(tmp_path, capsys):
    from kvagent.cli.demo import run_demo
    from kvagent.cli.settings import EngineOptions

    records = run_demo(
        EngineOptions(model="smollm2"),
        out=str(tmp_path),
        budget=1536,
        turns=10,
        progress=False,
        policies=("random",),
    )
    out = capsys.readouterr().out
    assert "Fidelity vs the full cache" in out and "random" in out
    by = {(r["policy"], r["mode"]): r for r in records if not r.get("history")}
    masked = next(r for r in records if r.get("history"))  # the observation-masking row
    assert masked["kl"] > 0.0 and masked["kv_mean"] < by[("full", "persistent")]["kv_mean"]
    assert by[("full", "persistent")]["kl"] == 0.0
    assert by[("random", "persistent")]["rounds"] > 0
    # The planted fact is one the full cache retrieves on SmolLM2 (else the demo drops the probe):
    # the demo shows which evicting runs lose it.
    full = by[("full", "persistent")]
    assert full["probe_retrieved"] is True and full["probe_logp"] > -1.0, full
    assert (tmp_path / "demo.png").exists() and (tmp_path / "fidelity.md").exists()
