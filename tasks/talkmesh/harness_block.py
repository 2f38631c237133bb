"""The ``mesh`` section of a ``loop_type: talkmesh`` harness spec and the rest of that loop type's
spec validation, registered with the application (:mod:`tasks.talkmesh.application`); the harness
spec (:class:`tasks.harnesses.spec.HarnessSpec`) validates an application's section through the
registry."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.harnesses.spec import SamplingSpec


class MeshHeadSpec(BaseModel):
    """The TalkMesh confidence head (:func:`tasks.talkmesh.calibration.fit_head`): ``l2`` penalty,
    L-BFGS ``steps``, ECE ``bins`` of its calibration table, ``batch_size`` texts per hidden-state
    forward pass."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    l2: float = Field(default=1e-2, ge=0)
    steps: int = Field(default=100, ge=1)
    bins: int = Field(default=10, ge=1, le=100)
    batch_size: int = Field(default=16, ge=1)


class MeshSpec(BaseModel):
    """The ``mesh`` block of a ``talkmesh`` harness (P3: docs/methods/p3-talkmesh.md; :mod:`tasks.talkmesh.mesh`).

    ``agents`` N (2..256) share the policy; ``topology`` full | ring | regular (random
    ``degree``-regular); ``rounds`` of hint + revision (0..16); agents with a confidence below
    ``threshold`` (in [0, 1]) revise. ``head_samples``: base-policy proposals per train task that
    the rollout stage grades and fits the confidence head on. ``talk_sampling``: sampler of hints
    and revisions (proposals use the harness's ``sampling``). ``max_solution_chars``: a solution
    quoted in a hint or revision prompt is cut to this many characters.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    agents: int = Field(ge=2, le=256)
    topology: Literal["full", "ring", "regular"] = "full"
    degree: int = Field(default=2, ge=1)
    rounds: int = Field(default=1, ge=0, le=16)
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    head_samples: int = Field(default=4, ge=1, le=256)
    head: MeshHeadSpec = Field(default_factory=MeshHeadSpec)
    talk_sampling: SamplingSpec = Field(default_factory=lambda: SamplingSpec(temperature=0.7, max_new_tokens=128))
    max_solution_chars: int = Field(default=600, ge=50)

    @model_validator(mode="after")
    def _check(self) -> "MeshSpec":
        if self.topology == "regular":
            from tasks.talkmesh.topology import build_topology

            try:
                build_topology("regular", self.agents, self.degree, 0)
            except ValueError as e:
                raise ValueError(f"mesh.degree={self.degree} with mesh.agents={self.agents}: {e}") from None
        return self


def check_mesh_harness(spec: Any) -> None:
    """The rest of a ``talkmesh`` spec's validation (its ``mesh`` block is validated already).

    Raises:
        ValueError: environments other than ``[answer]``, an action format other than
            ``final_answer``, a skill or demonstrations (the message names the key and value).
    """
    if spec.environments != ["answer"]:
        raise ValueError(f"loop_type talkmesh needs environments: [answer], not {spec.environments}")
    if spec.action_format != "final_answer":
        raise ValueError(f"loop_type talkmesh needs action_format final_answer, not {spec.action_format}")
    if spec.skill is not None:
        raise ValueError("skill: loop_type talkmesh takes no skill (its agents' prompts use system_prompt as written)")
    if spec.demonstrations:
        raise ValueError("demonstrations: loop_type talkmesh takes none (its agents' prompts are built by "
                         "tasks.talkmesh.talk, which does not show them)")
