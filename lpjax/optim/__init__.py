"""Optax transformations for low-precision training: Stable-SPAM, SPAM, loss and gradient scaling.

``lpjax.optim`` depends on nothing else of lpjax. The update rules are those of the numerics
contract (docs/numerics.md §8 Stable-SPAM, §9 SPAM); see ``docs/optimizers.md`` for usage and the
paper's hyperparameters.

Examples:
  >>> import jax.numpy as jnp, optax
  >>> from lpjax import optim
  >>> tx = optax.chain(optim.stable_spam(weight_decay=0.1), optax.scale_by_learning_rate(1e-3))
  >>> state = tx.init({"w": jnp.zeros((2, 2))})
  >>> type(state[0][0]).__name__  # chain(chain(scale_by_stable_spam, decay), lr)
  'ScaleByStableSpamState'
"""

from lpjax.optim._loss_scale import (
    DynamicLossScale,
    ScaleByAdaptiveGradientScalerState,
    SkipNonfiniteState,
    all_finite,
    scale_by_adaptive_gradient_scaler,
    skip_nonfinite,
)
from lpjax.optim._low_precision_state import stochastic_round_to_bf16
from lpjax.optim._spam import (
    DecayUpdatedWeightsState,
    ScaleBySpamState,
    decay_updated_weights,
    scale_by_spam,
    spam,
)
from lpjax.optim._stable_spam import (
    ScaleByStableSpamState,
    scale_by_stable_spam,
    stable_spam,
)

__all__ = [
    "DecayUpdatedWeightsState",
    "DynamicLossScale",
    "ScaleByAdaptiveGradientScalerState",
    "ScaleBySpamState",
    "ScaleByStableSpamState",
    "SkipNonfiniteState",
    "all_finite",
    "decay_updated_weights",
    "scale_by_adaptive_gradient_scaler",
    "scale_by_spam",
    "scale_by_stable_spam",
    "skip_nonfinite",
    "spam",
    "stable_spam",
    "stochastic_round_to_bf16",
]
