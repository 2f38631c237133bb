"""The documentation site builds with ``mkdocs build --strict`` (a broken link, a missing page or
a failing generator fails it), and its generated reference pages follow the code."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gen_docs  # noqa: E402


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).parent / "mkdocs"
    res = subprocess.run([str(mkdocs), "build", "--strict", "-d", str(out)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


def test_site_builds_with_every_nav_page(site):
    for page in ("index", "concepts", "analyses", "operations", "scale-out", "benchmarks",
                 "reference/configuration", "reference/harness-spec", "reference/commands",
                 "experiments/p1-p4", "experiments/p2-bipa", "experiments/p3-talkmesh", "experiments/p5-kl",
                 "experiments/p6-gspo", "design", "methods/index", "methods/p1-ceiling-mismatch",
                 "methods/p2-bipa", "methods/p3-talkmesh", "methods/p4-within-cross", "methods/p5-kl",
                 "methods/p6-gspo-lora"):
        assert (site / f"{page}.html").is_file(), page
    # the experiment pages include their config files verbatim (pymdownx.snippets): a phrase of its header
    assert "builds .venv-vllm" in (site / "experiments/p1-p4.html").read_text()  # only in the config file


def test_configuration_reference_covers_every_section_and_key(site):
    from tasks.config import RunConfig

    html = (site / "reference/configuration.html").read_text()
    for name in RunConfig.model_fields:
        assert f"<code>{name}</code>" in html, name
    for key in ("train.batch_size", "train.kl.estimator", "evaluate.contrasts[].a.checkpoint",
                "analyze.leakage.permutations", "policy.vllm.lora", "suites[].reward"):
        assert f"<code>{key}</code>" in html, key


def test_config_reference_tracks_the_models():
    """Every field of every section appears with its default; a new field shows up by itself."""
    from tasks.config import KLConfig, RunConfig, TrainConfig

    md = gen_docs.config_reference()
    for name, field in TrainConfig.model_fields.items():
        assert f"| `train.{name}` |" in md, name
    assert "| `train.kl.estimator` | 'k1' \\| 'k2' \\| 'k3' | `'k1'` |" in md
    assert f"| `train.kl.beta` | float | `{KLConfig().beta}` | >= `0.0` |" in md
    assert "| `name` | str | required |" in md
    assert md.count("\n## ") == sum(bool(gen_docs._models_in(f.annotation)) for f in RunConfig.model_fields.values()) + 1


def test_harness_reference_lists_every_shipped_harness():
    from tasks.harnesses.spec import load_harness, shipped_harnesses

    md = gen_docs.harness_reference()
    for name in shipped_harnesses():
        h = load_harness(name)
        assert f"| `{name}` | {h.family} | `{h.action_format}` | `{h.loop_type}` |" in md
    assert "| `mesh.head.steps` |" in md and "| `tools[].timeout_s` |" in md


def test_benchmarks_page_shows_the_newest_rows(tmp_path):
    rows = [{"commit": f"{i:040x}", "date": f"2026-12-0{i + 1}T00:00:00+00:00",
             "machine": {"platform": "Linux", "cpus": 2, "torch_device": "cpu"}, "smoke": True, "rows_per_s": i}
            for i in range(gen_docs.ROWS_SHOWN + 2)]
    (tmp_path / "artifact_store.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = gen_docs.benchmarks_page(tmp_path)
    assert "## artifact_store" in md and "What the artifact contracts cost" in md
    line = next(x for x in md.splitlines() if x.startswith("| `rows_per_s` |"))
    newest_first = list(range(len(rows) - 1, len(rows) - 1 - gen_docs.ROWS_SHOWN, -1))
    assert line == "| `rows_per_s` | " + " | ".join(map(str, newest_first)) + " |"
    assert "| `machine.cpus` | " + " | ".join(["2"] * gen_docs.ROWS_SHOWN) + " |" in md
    assert f"{len(rows)} row(s)" in md
    # a script without rows still has its section, saying how to add one
    assert "## rollout\n" in md and "No rows recorded yet: run `.venv/bin/python benchmarks/rollout.py`." in md
    # a figure the row withdraws is not stated on the page; the reason is
    rows[-1].update(speedup=2.03, withdrawn={"speedup": "not on one clock"}, same_sampler={"engine_speedup": 1.25})
    (tmp_path / "artifact_store.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = gen_docs.benchmarks_page(tmp_path)
    assert "| `speedup` | withdrawn (see `withdrawn`) |" in md and "2.03" not in md
    assert 'not on one clock' in next(x for x in md.splitlines() if x.startswith("| `withdrawn` |"))
    # a block of figures is one line per figure, not a cut-off dict
    assert "| `same_sampler.engine_speedup` | 1.25 |" in md
    empty = gen_docs.benchmarks_page(tmp_path / "none")
    for script in (ROOT / "benchmarks").glob("[!_]*.py"):
        assert f"## {script.stem}\n" in empty


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def test_readme_is_short_and_starts_with_the_two_commands():
    text = _readme()
    assert len(text.splitlines()) <= 200
    block = text.split("## First two commands", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert block.splitlines() == ["./scripts/bootstrap.sh && .venv/bin/harnessrl run",
                                  "./scripts/bootstrap.sh && .venv/bin/python -m pytest"]
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert images and all((ROOT / i).is_file() for i in images), images  # the one figure is there


def test_readme_layout_matches_the_tree():
    """Every path the layout names exists, and every tracked top-level entry is named."""
    layout = _readme().split("## Layout", 1)[1].split("```\n", 1)[1].split("```", 1)[0]
    named_top, parent = set(), None
    for line in layout.splitlines():
        # columns are separated by 2+ spaces: name, description[, name, description]
        cols = re.split(r"\s{2,}", line.strip())
        if line.startswith("  "):
            for name in cols[0::2]:
                assert (ROOT / parent / name).exists(), f"{parent}{name}"
        else:
            name = cols[0].split()[0]  # "prefect.yaml Prefect ..." has a single space
            assert (ROOT / name).exists(), name
            named_top.add(name.rstrip("/").split("/")[0])
            parent = name
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines()
    top = {f.split("/")[0] for f in tracked} - {"README.md", ".gitignore"}
    assert top <= named_top, sorted(top - named_top)


def test_the_findings_page_shows_each_published_row_and_the_run_figures(tmp_path):
    findings_page = gen_docs.findings_page
    assert "No findings recorded yet" in findings_page(tmp_path, tmp_path / "none")
    row = {"paper": "P4", "name": "x", "headline": "A | B", "measure": "contrast", "estimate": 0.1234, "ci_low": -0.02,
           "ci_high": 0.25, "n": 120, "verdict": "inconclusive", "control": 0.01, "config": "configs/p4-findings.yaml",
           "config_hash": "ab" * 32, "commit": "0123456789abcdef", "key_fingerprint": "f", "wall_s": 5400.4}
    (tmp_path / "findings.jsonl").write_text(json.dumps(row) + "\n")
    figs = tmp_path / "figs"
    figs.mkdir()
    (figs / "p4-findings-abababab--pass_rate_heatmap.png").write_bytes(b"png")
    page = findings_page(tmp_path, figs)
    assert "| P4 | A \\| B | contrast | +0.123 | [-0.020, +0.250] | 120 | +0.010 | not recorded | **inconclusive** |" \
        in page  # a row published before rows carried seeds and the control's interval
    # a rule-2 row: the control's interval, the seeds, and a single-seed recipe comparison marked
    rule2 = {**row, "control_ci_low": -0.031, "control_ci_high": 0.052, "seeds": {"gspo": 1, "grpo": 1},
             "single_seed": True, "interval": "task", "rule": 2}
    (tmp_path / "findings.jsonl").write_text(json.dumps(rule2) + "\n")
    assert "| 120 | +0.010 [-0.031, +0.052] | gspo 1, grpo 1 | **inconclusive** (single seed) |" in \
        findings_page(tmp_path, figs)
    (tmp_path / "findings.jsonl").write_text(json.dumps({**rule2, "control_ci_low": None, "control_ci_high": None,
                                                         "seeds": {"gspo": 3, "grpo": 3}, "single_seed": False})
                                             + "\n")
    assert "| +0.010 [n/a] | gspo 3, grpo 3 | **inconclusive** |" in findings_page(tmp_path, figs)
    # a BiPA row: its optimizer seeds (a claim about the optimizer) or none (the hand-written pool)
    p2 = {k: v for k, v in rule2.items() if k not in ("seeds", "single_seed")}  # BiPA rows carry no training seeds
    (tmp_path / "findings.jsonl").write_text(json.dumps({**p2, "paper": "P2", "optimizer_seeds": 3}) + "\n"
                                             + json.dumps({**p2, "paper": "P2", "optimizer_seeds": None}) + "\n")
    bipa = findings_page(tmp_path, figs)
    assert "| +0.010 [-0.031, +0.052] | optimizer 3 |" in bipa and "| +0.010 [-0.031, +0.052] | none |" in bipa
    assert "`0123456789ab` | 5400 | not recorded |" in page  # published before rows carried infra counts
    infra = {"infra_errors": {"rollout": 3, "train": 0, "evaluate": 0},
             "infra_planned": {"rollout": 640, "train": 0, "evaluate": 800}, "infra_total": 3, "infra_threshold": 0.01}
    (tmp_path / "findings.jsonl").write_text(json.dumps({**row, **infra}) + "\n")
    assert "| 5400 | rollout 3/640 |" in findings_page(tmp_path, figs)
    none = {**infra, "infra_errors": {"rollout": 0, "train": 0, "evaluate": 0}, "infra_total": 0}
    (tmp_path / "findings.jsonl").write_text(json.dumps({**row, **none}) + "\n")
    assert "| 5400 | 0 of 1440 |" in findings_page(tmp_path, figs)
    assert "![pass_rate_heatmap of p4-findings-abababab](img/findings/p4-findings-abababab--pass_rate_heatmap.png)" in page
    # a row from an application run without a signed chain (P3's harnessrl talkmesh) says so
    (tmp_path / "findings.jsonl").write_text(json.dumps({**row, "paper": "P3", "sealed": False, "key_fingerprint": None})
                                             + "\n")
    assert "| **inconclusive** (not sealed) |" in findings_page(tmp_path, figs)
    assert "(not sealed)" not in page
    # the P1/P4 rows graded by the last-number fallback are marked as such
    (tmp_path / "findings.jsonl").write_text(json.dumps({**row, "grading": "last_number_fallback"}) + "\n")
    assert "| **inconclusive** (fallback-graded) |" in findings_page(tmp_path, figs)
    assert "(fallback-graded) |" not in page


def test_the_findings_page_shows_each_runs_arms_last_published(tmp_path):
    row = {"paper": "P5", "name": "x", "headline": "h", "measure": "contrast", "estimate": 0.1, "ci_low": 0.0,
           "ci_high": 0.2, "n": 10, "verdict": "inconclusive", "control": None, "config": "c", "config_hash": "ab",
           "commit": "0123456789abcdef", "key_fingerprint": "f", "wall_s": 1.0}
    (tmp_path / "findings.jsonl").write_text(json.dumps(row) + "\n")
    arm = {"run": "p5-findings-abc", "arm": "k3-reward", "kl_config": "k3/reward", "beta": 0.3, "max_staleness": 0,
           "reward_control": "none", "unbiased": False, "relative_bias": 1.804, "stable": False,
           "reason": "reward collapsed: last 3 steps 0.050 < 0.5 x first 3 0.200", "early_reward": 0.2,
           "late_reward": 0.05, "pass_at_1": [{"harness": "direct", "suite": "reasoning_gym/chain_sum",
                                               "pass_at_1": 0.25, "ci_low": 0.1, "ci_high": 0.4}]}
    nokl = {**arm, "arm": "nokl", "kl_config": "", "beta": 0.0, "unbiased": None, "relative_bias": None, "stable": True,
            "reason": "", "pass_at_1": [{**arm["pass_at_1"][0], "pass_at_1": None}]}
    old = {**arm, "stable": True, "reason": ""}  # published before: the later row of the same arm wins
    (tmp_path / "findings_arms.jsonl").write_text("".join(json.dumps(a) + "\n" for a in (old, arm, nokl)))
    page = gen_docs.findings_page(tmp_path, tmp_path / "no-figures")
    assert "## `p5-findings-abc`" in page
    assert ("| k3-reward | k3/reward | 0.3 | 0 | none | no | 1.804 | no (reward collapsed: last 3 steps 0.050 < 0.5 x "
            "first 3 0.200) | 0.200 -> 0.050 | direct chain_sum: 0.250 [0.100, 0.400] |") in page
    assert "| nokl | none | 0 | 0 | none | n/a | n/a | yes | 0.200 -> 0.050 | direct chain_sum: n/a |" in page
    assert page.count("| k3-reward |") == 1
    assert "Agent steps (turns)" not in page  # no arm row carries P6's steps: no steps table


def test_the_findings_page_shows_p6_steps_before_and_after(tmp_path):
    row = {"paper": "P6", "name": "x", "headline": "h", "measure": "contrast", "estimate": 0.1, "ci_low": 0.0,
           "ci_high": 0.2, "n": 10, "verdict": "inconclusive", "control": None, "config": "c", "config_hash": "ab",
           "commit": "0123456789abcdef", "key_fingerprint": "f", "wall_s": 1.0}
    (tmp_path / "findings.jsonl").write_text(json.dumps(row) + "\n")

    def st(h, solved, graded, med_s, mean_s, med_f, mean_f, ends, tool, note=""):
        return {"harness": h, "graded": graded, "solved": solved, "failed": graded - solved,
                "median_turns_solved": med_s, "mean_turns_solved": mean_s, "median_turns_failed": med_f,
                "mean_turns_failed": mean_f, **dict(zip(("failed_submitted", "failed_max_turns", "failed_max_tokens",
                                                         "failed_format_error", "failed_timeout"), ends)),
                "format_error_attempts": 0, "tool_error_attempts": tool, "truncated_turns": 0, "unparsed_answers": 0,
                "note": note}
    base = [st("react-python-skill", 0, 4, None, None, 3.0, 2.75, (1, 2, 1, 0, 0), 1,
               note="no solved attempt: turns per solved attempt n/a")]
    arm = {"run": "p6-findings-abc", "arm": "gspo", "kl_config": "", "beta": 0.0, "max_staleness": 0,
           "reward_control": "none", "unbiased": None, "relative_bias": None, "stable": True, "reason": "",
           "early_reward": 0.1, "late_reward": 0.2, "pass_at_1": [],
           "steps": [st("react-python-skill", 2, 4, 1.5, 1.5, 3.0, 3.0, (0, 2, 0, 0, 0), None)], "base_steps": base}
    (tmp_path / "findings_arms.jsonl").write_text(json.dumps(arm) + "\n")
    page = gen_docs.findings_page(tmp_path, tmp_path / "no-figures")
    assert "| base | react-python-skill | 0 / 4 | n/a | 3 (2.75) | 1 | 2 | 1 | 0 | 0 | 1 |" in page
    assert "| gspo | react-python-skill | 2 / 4 | 1.5 (1.50) | 3 (3.00) | 0 | 2 | 0 | 0 | 0 | n/a |" in page
    assert "- base / react-python-skill: no solved attempt: turns per solved attempt n/a" in page
