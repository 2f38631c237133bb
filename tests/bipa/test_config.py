"""BiPA config: the shipped small config loads; bad values are refused naming the key."""

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from tasks.bipa.config import load_bipa_config
from tasks.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path, **bipa):
    d = yaml.safe_load((ROOT / "configs/bipa-small.yaml").read_text())
    d["bipa"].update(bipa)
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def test_shipped_config_loads():
    cfg = load_bipa_config(ROOT / "configs/bipa-small.yaml")
    assert cfg.seed_harness_name() == "react-python-skill"
    assert (cfg.bipa.candidates, cfg.bipa.selection_tasks, cfg.bipa.samples, cfg.bipa.accept.better_by) == (3, 6, 2, 0.0)


@pytest.mark.parametrize("bipa, needle", [
    ({"harness": "direct"}, "not in harnesses"),
    ({"candidates": 0}, "bipa.candidates"),
    ({"accept": {"better_by": -1}}, "bipa.accept.better_by"),
    ({"typo": 1}, "bipa.typo"),
])
def test_bad_values_are_refused(tmp_path, bipa, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_bipa_config(_write(tmp_path, **bipa))


def test_harness_without_skill_is_refused(tmp_path):
    p = _write(tmp_path)
    with pytest.raises(ConfigError, match="has no skill section"):
        load_bipa_config(p, {"harnesses": ["direct", "react-python-skill"], "bipa.harness": "direct"})


def test_cli_reports_a_bad_config(tmp_path):
    res = CliRunner().invoke(app, ["bipa", "-c", str(_write(tmp_path, samples=0))])
    assert res.exit_code == 2 and "bipa.samples" in res.output
