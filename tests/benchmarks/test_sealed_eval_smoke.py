"""``benchmarks/sealed_eval.py --smoke``: the multi-turn bookkeeping benchmark runs end to end on
tiny sizes and its row adds up (the full sizes are measured by running the script, not here)."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sealed_eval.py"


def test_sealed_eval_smoke_multi_turn(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # as when run as a script: its folder on the path
    spec = importlib.util.spec_from_file_location("sealed_eval_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "rows.jsonl"
    row = mod.main(["--smoke", "--results", str(out)])
    written = json.loads(out.read_text().splitlines()[-1])
    assert {k: v for k, v in written.items() if k not in ("commit", "date", "machine")} == row
    assert written["machine"]["cpus"] > 0 and written["date"].endswith("+00:00")
    assert row["mode"] == "multi-turn" and row["turns_per_attempt"] == 4
    # 8 test tasks x 4 harnesses x 3 checkpoints x 2 attempts, plus one retry row per infra_error
    assert row["planned_evaluations"] == 8 * 4 * 3 * 2 == row["sealed_rows"] - row["retry_rows"]
    assert row["retry_rows"] > 0 and row["verified_rows"] == row["sealed_rows"]
    assert row["turn_rows"] == 4 * row["sealed_rows"]  # every attempt, retries too, has its 4 turns
    assert row["ours_total_s (stage - scripted runner + verify)"] > 0 and row["peak_rss_mib"] > 0


def test_scripted_multi_turn_rows_rebuild_to_the_context(tmp_path):
    """The scripted agentic episode is stored as the engine stores turns: 2,000 context tokens."""
    from tasks.evaluate.scripted import ScriptedRunner
    from tasks.rollout.turns import episode_sequence, prompt_lengths

    r = ScriptedRunner(turns=8, context_tokens=2000, chunk_records=1)
    rec = {"record_id": "r", "harness_name": "direct"}
    (eps, turns), = list(r(None, None, {}, {}, [rec], 1, 3, "t"))
    ids, starts = episode_sequence(turns)
    assert len(turns) == 8 and len(ids) == 2000 and starts == prompt_lengths(turns)
    assert eps[0]["input_tokens"] == sum(starts) and eps[0]["output_tokens"] == 8 * 100
    assert len(set(ids)) > 1000  # pseudo-random ids, not one repeated token
