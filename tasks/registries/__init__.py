"""The registries of what people add to the trainer, one place each: KL estimators (with what
their source says of their gradient, which ``harnessrl kl-check`` verifies), loss aggregations and
advantage estimators.

Each built-in is registered in its registry's module; one added elsewhere (a module of one's own,
a test) is registered the same way. The config's allowed values (``train.kl.estimator``,
``train.agg``, ``train.advantage_scale``), the ``kl_check`` contract's allowed estimators, the
trainer and ``kl-check``'s parser all read the registry, so a new entry is one registration.

Pure Python at import (no torch): the config and the contracts import it; the math runs on the
tensors it is given.
"""

from tasks.registries.advantage_estimators import ADVANTAGE_ESTIMATORS, AdvantageEstimator
from tasks.registries.kl_estimators import KL_ESTIMATORS, LOG_RATIO_CLAMP, PLACEMENTS, STALE_SAMPLINGS, KLEstimator
from tasks.registries.loss_aggregations import LOSS_AGGREGATIONS, LossAggregation
from tasks.registries.registry import OneOf, Registry

__all__ = ["ADVANTAGE_ESTIMATORS", "AdvantageEstimator", "KL_ESTIMATORS", "KLEstimator", "LOG_RATIO_CLAMP",
           "LOSS_AGGREGATIONS", "LossAggregation", "OneOf", "PLACEMENTS", "Registry", "STALE_SAMPLINGS"]
