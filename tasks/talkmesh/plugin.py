"""TalkMesh as a loop type of the pipeline (``loop_type: talkmesh``): the
:class:`tasks.rollout.loop_plugins.LoopPlugin` the cores call, registered through the
application registry (:mod:`tasks.talkmesh.application`). The work is in :mod:`tasks.talkmesh.episodes`."""

from __future__ import annotations

from typing import Any

from tasks.talkmesh import episodes as E


class TalkMeshLoop:
    """Mesh runs instead of engine episodes; the confidence head is the fitted state
    (``talkmesh_head``, with ``talkmesh_calibration_<harness>`` beside it); the talk policy trains on
    one sequence per hint or revision (``talkmesh_talk_sequences``), frozen mode only."""

    loop_type = "talkmesh"
    state_artifact = "talkmesh_head"
    trains_online = False

    def fit(self, policy: Any, cfg: Any, specs: dict[str, Any], tasks: dict[str, dict[str, Any]],
            records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, tuple[list[dict[str, Any]], str]]]:
        heads, calib = E.fit_heads(policy, cfg, specs, tasks, records)
        return heads, {f"talkmesh_calibration_{name}": (rows, "talkmesh_calibration") for name, rows in calib.items()}

    def states(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return E.heads_from_rows(rows)

    def run_records(self, policy: Any, cfg: Any, spec: Any, harness_id: str, tasks: dict[str, dict[str, Any]],
                    records: list[dict[str, Any]], samples: int, seed: int, tag: str, state: Any
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return E.run_mesh_records(policy, cfg, spec, harness_id, tasks, records, samples, seed, tag, state,
                                  E.hidden_states(cfg, spec))

    def owns_turn(self, action_json: str | None) -> bool:
        return E.is_mesh_turn(action_json)

    def train_sequences(self, episodes: list[dict[str, Any]], turns: list[dict[str, Any]], specs: dict[str, Any]
                        ) -> tuple[list[Any], dict[str, list[dict[str, Any]]]]:
        seqs, rows = E.talk_train_sequences(episodes, turns, specs)
        if not seqs:
            raise ValueError("train: the talkmesh rollouts hold no hint or revision with a reward (no agent was below "
                             "mesh.threshold?); nothing to train the talk policy on")
        return seqs, {"talkmesh_talk_sequences": rows}


PLUGIN = TalkMeshLoop()
