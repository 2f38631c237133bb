"""Turn rows store what each turn adds (turns contract v2), and the prompts rebuilt from them are
exactly the prompts the v1 contract stored in full (``fixtures/turns_v1.json``, made with the v1
code by ``fixtures/make_turns_v1.py``)."""

import json
from pathlib import Path

import pytest

from tasks.rollout.turns import (TurnsError, by_episode, episode_prompts, episode_sequence, first_turn, iter_prompts,
                                 next_turn, prompt_lengths)
from tests.facilities import bwrap_missing, require
from tests.rollout.fixtures.make_turns_v1 import fixture_run

FIXTURE = Path(__file__).with_name("fixtures") / "turns_v1.json"


@pytest.fixture(scope="module")
def v1():
    return json.loads(FIXTURE.read_text())


def _v1_draw(logp, generator, block=None):
    """The draw the hf engine made when the fixture was recorded: transformers' sampling step,
    ``torch.multinomial`` over the softmax of the processed scores, from the global generator
    (``torch.manual_seed(seed)`` per batch), not the engine's block race."""
    import torch

    return torch.multinomial(torch.softmax(logp, dim=-1), num_samples=1)[:, 0]


@pytest.fixture(scope="module")
def v2(tiny_model_dir, tmp_path_factory):
    require("bubblewrap", bwrap_missing())
    model = tmp_path_factory.mktemp("fixture-model") / "tiny"  # the policy id (so episode ids) names the folder
    model.symlink_to(tiny_model_dir)
    with pytest.MonkeyPatch.context() as mp:  # the fixture's completions need the fixture's sampler
        mp.setattr("tasks.rollout.engines.hf.sample_tokens", _v1_draw)
        eps, turns = fixture_run(str(model))
    for e in eps:
        e.pop("record")
    return eps, turns


def test_rebuilt_prompts_are_the_v1_rows_prompts(v1, v2):
    eps, turns = v2
    # every v1 column (input_tokens too: the sum of the full prompts); later columns (stop_reason) aside
    assert [{k: e[k] for k in old} for e, old in zip(json.loads(json.dumps(eps)), v1["episodes"])] == v1["episodes"]
    assert len(turns) == len(v1["turns"]) == 40
    old = by_episode(v1["turns"])
    new = by_episode(turns)
    assert list(new) == list(old)
    for eid, ts in new.items():
        want = [t["prompt_token_ids"] for t in old[eid]]
        assert episode_prompts(ts) == want
        assert prompt_lengths(ts) == [len(p) for p in want]
        for a, b in zip(ts, old[eid]):  # every other column as v1 wrote it (log-probs to float32 rounding:
            # the fixture was made in another process, whose CPU kernels may sum in another order)
            rest = {k: v for k, v in b.items() if k not in ("prompt_token_ids", "completion_logprobs")}
            assert json.loads(json.dumps({k: a[k] for k in rest})) == rest
            assert a["completion_logprobs"] == pytest.approx(b["completion_logprobs"], abs=1e-5)
    assert max(len(ts) for ts in new.values()) == 8  # swe-agent-like ran all its turns


def test_storage_is_the_final_context_not_every_prompt_again(v1, v2):
    _, turns = v2
    for eid, ts in by_episode(turns).items():
        ids, starts = episode_sequence(ts)
        last = ts[-1]
        stored = sum(len(t["prompt_added_ids"]) + len(t["completion_token_ids"]) for t in ts)
        assert stored == len(ids) == starts[-1] + len(last["completion_token_ids"])
        assert [t["prompt_continues"] for t in ts] == [False] + [True] * (len(ts) - 1)
        for t, s in zip(ts, starts):
            assert ids[s:s + len(t["completion_token_ids"])] == t["completion_token_ids"]
    v1_tokens = sum(len(t["prompt_token_ids"]) for t in v1["turns"])
    v2_tokens = sum(len(t["prompt_added_ids"]) for t in turns)
    print(f"prompt tokens stored: v1 {v1_tokens}, v2 {v2_tokens}")
    assert v2_tokens * 4 < v1_tokens  # 8-turn episodes of ~1,300-2,000 tokens: v1 stores each context ~7x


def _t(eid, idx, cont, added, comp):
    return {"episode_id": eid, "turn_idx": idx, **(next_turn(added) if cont else first_turn(added)),
            "completion_token_ids": comp}


def test_rebuild_rules_and_refusals():
    ts = [_t("e", 1, True, [7], [8, 9]), _t("e", 0, False, [1, 2], [3]), _t("e", 2, True, [], [4])]
    assert episode_prompts(ts) == [[1, 2], [1, 2, 3, 7], [1, 2, 3, 7, 8, 9]]
    assert prompt_lengths(ts) == [2, 4, 6]
    assert episode_sequence(ts) == ([1, 2, 3, 7, 8, 9, 4], [2, 4, 6])
    # a callers' change to a yielded prompt does not leak into the next one
    it = iter_prompts(ts)
    _, p0 = next(it)
    p0.append(99)
    assert next(it)[1] == [1, 2, 3, 7]
    # separate prompts (TalkMesh messages): rebuilt as stored, never chained
    mesh = [_t("m", 0, False, [1], [2]), _t("m", 1, False, [5, 6], [7])]
    assert episode_prompts(mesh) == [[1], [5, 6]]
    with pytest.raises(TurnsError, match="turn 1: its prompt does not continue"):
        episode_sequence(mesh)
    with pytest.raises(TurnsError, match="turn 0: prompt_continues is true"):
        episode_prompts([_t("e", 0, True, [1], [2])])
    with pytest.raises(TurnsError, match=r"turn_idx \[0, 2\] is not 0..1"):
        episode_prompts([_t("e", 0, False, [1], [2]), _t("e", 2, True, [1], [2])])
    with pytest.raises(TurnsError, match="given as one episode"):
        prompt_lengths([_t("e", 0, False, [1], [2]), _t("f", 1, True, [1], [2])])
