from tasks.config import RunConfig
from tasks.records.freeze import freeze_tables, record_id
from tasks.records.verifiers import score


def _cfg(**kw):
    base = dict(name="t", suites=[{"name": "basic_arithmetic", "size": 10, "seed": 3},
                                 {"name": "gsm_symbolic", "size": 5, "seed": 3}],
                harnesses=["direct", "react-python"], split={"test_fraction": 0.3})
    base.update(kw)
    return RunConfig.model_validate(base)


def test_freeze_is_deterministic_and_splits_are_disjoint_by_hash():
    t1, h1, r1 = freeze_tables(_cfg())
    t2, h2, r2 = freeze_tables(_cfg())
    assert (t1, h1, r1) == (t2, h2, r2)
    train = {t["task_hash"] for t in t1 if t["split"] == "train"}
    test = {t["task_hash"] for t in t1 if t["split"] == "test"}
    assert train and test and not (train & test)
    assert len(test) == 3 + 2  # round(0.3 * 10) + round(0.3 * 5), per suite
    assert len(r1) == len(t1) * 2
    r = r1[0]
    assert r["record_id"] == record_id(r["task_hash"], r["harness_id"], 0)


def test_split_follows_content_not_order():
    t_a, _, _ = freeze_tables(_cfg())
    t_b, _, _ = freeze_tables(_cfg(suites=[{"name": "gsm_symbolic", "size": 5, "seed": 3},
                                           {"name": "basic_arithmetic", "size": 10, "seed": 3}]))
    assert {t["task_hash"]: t["split"] for t in t_a} == {t["task_hash"]: t["split"] for t in t_b}


def test_hidden_answer_is_not_in_the_instruction_and_verifier_grades():
    tasks, _, _ = freeze_tables(_cfg())
    import json

    for t in tasks:
        spec = json.loads(t["verifier_spec"])
        assert "answer_cot" not in t["metadata"] and "answer" not in json.loads(t["metadata"])
        assert score(t["verifier_kind"], spec, spec["answer"]) == 1.0
        wrong = str(int(float(spec["answer"])) + 1)
        assert score(t["verifier_kind"], spec, wrong) < 1.0
        assert score(t["verifier_kind"], spec, None) == 0.0
