import copy

import pytest

from tasks.evaluate.seal import SealError, plan_hash, seal_rows, verify_chain


def _plan():
    return {
        "records": [{"record_id": f"r{i}", "task_hash": f"t{i}", "harness_name": "direct", "harness_id": "h"} for i in range(3)],
        "checkpoints": [{"name": "base", "path": "", "adapter_sha256": ""},
                        {"name": "final", "path": "ck", "adapter_sha256": "abc"}],
        "attempts": 2,
        "seed": 1,
    }


def _rows(plan):
    rows = []
    for ck in plan["checkpoints"]:
        for rec in plan["records"]:
            for a in range(plan["attempts"]):
                rows.append({"eval_id": f"{ck['name']}-{rec['record_id']}-{a}", "record_id": rec["record_id"],
                             "checkpoint": ck["name"], "harness_name": rec["harness_name"], "attempt": a,
                             "reward": float(a), "status": "resolved" if a else "unresolved"})
    return seal_rows(rows, plan_hash(plan))


def test_intact_chain_verifies_and_head_commits_to_everything():
    plan = _plan()
    rows = _rows(plan)
    rep = verify_chain(plan, plan_hash(plan), rows, checkpoint_sha=lambda ck: "abc")
    assert rep.rows == 12 and rep.head == rows[-1]["seal_hash"]
    assert rows[0]["prev_hash"] == plan_hash(plan)


@pytest.mark.parametrize("tamper,match", [
    (lambda p, r: r[5].update(reward=1.0 - r[5]["reward"]), "row 5 .*value was changed"),
    (lambda p, r: r.pop(4), "row 4 .*seq"),
    (lambda p, r: r.insert(2, dict(r[2])), "row 3 .*seq"),
    (lambda p, r: r.__setitem__(slice(3, 5), [r[4], r[3]]), "row 3"),
    (lambda p, r: p.update(attempts=1), "plan: hash"),
    (lambda p, r: r.pop(), "planned attempt"),
])
def test_every_tampering_is_named(tamper, match):
    plan = _plan()
    committed = plan_hash(plan)
    rows = _rows(plan)
    plan, rows = copy.deepcopy(plan), copy.deepcopy(rows)
    tamper(plan, rows)
    with pytest.raises(SealError, match=match):
        verify_chain(plan, committed, rows, checkpoint_sha=lambda ck: "abc")


def test_swapped_checkpoint_is_caught():
    plan = _plan()
    with pytest.raises(SealError, match="checkpoint 'final'"):
        verify_chain(plan, plan_hash(plan), _rows(plan), checkpoint_sha=lambda ck: "def")


def test_a_resealed_chain_with_changed_values_still_fails_against_the_committed_plan_hash():
    plan = _plan()
    committed = plan_hash(plan)
    rows = _rows(plan)
    plan2 = dict(plan, seed=2)
    forged = seal_rows([{k: v for k, v in r.items() if k not in ("seq", "plan_hash", "prev_hash", "seal_hash")}
                        for r in rows], plan_hash(plan2))
    with pytest.raises(SealError):
        verify_chain(plan2, committed, forged)


def _retry_plan_rows(status_of_original="infra_error", with_retry=True):
    plan = dict(_plan(), infra_retries=1)
    rows = []
    for ck in plan["checkpoints"]:
        for rec in plan["records"]:
            for a in range(plan["attempts"]):
                rows.append({"eval_id": f"{ck['name']}-{rec['record_id']}-{a}", "record_id": rec["record_id"],
                             "checkpoint": ck["name"], "harness_name": rec["harness_name"], "attempt": a,
                             "reward": 0.0, "status": "unresolved", "retry": 0, "retry_of": ""})
    rows[2]["status"] = status_of_original
    if with_retry:
        rows.append(dict(rows[2], eval_id="retry-1", status="resolved", reward=1.0, retry=1, retry_of=rows[2]["eval_id"]))
    return plan, seal_rows(rows, plan_hash(plan))


def test_a_retry_of_an_infra_error_verifies():
    plan, rows = _retry_plan_rows()
    assert verify_chain(plan, plan_hash(plan), rows).rows == 13


def test_a_retry_of_a_graded_attempt_is_refused():
    plan, rows = _retry_plan_rows(status_of_original="unresolved")
    with pytest.raises(SealError, match="row 12 .*retry 1 .*does not refer to an earlier infra_error"):
        verify_chain(plan, plan_hash(plan), rows)


def test_a_missing_planned_retry_is_refused():
    plan, rows = _retry_plan_rows(with_retry=False)
    with pytest.raises(SealError, match="infra_error at retry 0 .*retry row is missing"):
        verify_chain(plan, plan_hash(plan), rows)


def test_retries_beyond_the_plan_are_refused():
    plan, rows = _retry_plan_rows()
    plan = dict(plan, infra_retries=0)
    with pytest.raises(SealError, match="exceeds the plan's infra_retries=0"):
        verify_chain(plan, plan_hash(plan), seal_rows([{k: v for k, v in r.items() if k not in
                                                         ("seq", "plan_hash", "prev_hash", "seal_hash")} for r in rows],
                                                       plan_hash(plan)))
