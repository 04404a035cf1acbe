"""What the trainer needs from a model family: the `Task` interface.

A task owns its data and its model. The trainer owns everything else (mesh, sharding, optimizer,
loss scaling, non-finite skips, checkpoints, metrics), so the LLaMA, ResNet and U-Net runs share
one train step, one checkpoint format and one reliability story.

Examples:
  >>> sorted(Task.__abstractmethods__)
  ['batches', 'eval_batches', 'eval_summary', 'eval_sums', 'init_variables', 'loss', 'units_in']
"""

from __future__ import annotations

import abc
from typing import Any, Iterable, Iterator


class Task(abc.ABC):
  """A model family + its data. Subclasses set the attributes below in __init__(config, policy)."""

  name: str = ""  # "lm" | "classification" | "diffusion"
  partition_rules: tuple = ()  # (regex over param paths, logical axes): see lpjax/train/step/_sharding.py
  unit: str = "examples"  # what train/<unit>_per_second counts ("tokens", "images")
  policy = None  # the run's QuantPolicy (lpjax.train.step._precision.build_policy), the model's default

  def _set_policy(self, config, policy):
    from lpjax.train.step._precision import build_policy

    self.policy = policy if policy is not None else build_policy(config)

  def stacked_layers(self, params):
    """A pytree of bools like `params`: True where a leading axis stacks the layers (a scanned
    model); optimizers with per-tensor statistics keep them per layer there. Default: none."""
    import jax

    return jax.tree.map(lambda _: False, params)

  def pretrained_variables(self) -> tuple[Any, Any] | None:
    """(params, model_state) loaded from a checkpoint (model.init_from), as host arrays that the
    trainer places on its mesh, or None: `init_variables` builds them. Default: None."""
    return None

  @abc.abstractmethod
  def init_variables(self, key) -> tuple[Any, Any]:
    """(params, model_state); model_state is None or a pytree (e.g. BatchNorm statistics)."""

  @abc.abstractmethod
  def loss(self, params, model_state, batch: dict, key, policy) -> tuple[Any, tuple[Any, dict]]:
    """(scalar float32 loss, (new model_state, {name: scalar})) of one (micro)batch; jittable.

    `policy` is the static QuantPolicy of this step (None: the one the model was built with,
    `self.policy`; the precision schedule hands others in).
    """

  @abc.abstractmethod
  def batches(self, start_step: int, num_steps: int, process_index: int,
              process_count: int) -> Iterator[tuple[int, dict]]:
    """(step, this process's rows of the global batch) for steps start_step, start_step + 1, ...;
    a pure function of (config.seed, step), so a resumed run sees the batches it would have seen."""

  @abc.abstractmethod
  def units_in(self, local_batch: dict) -> int:
    """How many units (tokens, images) the global batch of this local batch holds."""

  @abc.abstractmethod
  def eval_batches(self, process_index: int, process_count: int) -> Iterable[dict]:
    """The evaluation batches (this process's rows), the same at every evaluation."""

  @abc.abstractmethod
  def eval_sums(self, params, model_state, batch: dict, policy) -> dict:
    """{name: scalar sum over the batch}; summed over batches, then `eval_summary`; jittable."""

  @abc.abstractmethod
  def eval_summary(self, sums: dict) -> dict:
    """{metric: float} from the summed `eval_sums`; must include "loss"."""

  def after_eval(self, params, model_state, step: int, workdir: str, is_main: bool) -> dict:
    """Extra evaluation outside the jitted sums (e.g. sample grids, FID); {metric: float}."""
    del params, model_state, step, workdir, is_main
    return {}

  def describe(self) -> dict:
    """Fields for results.json that identify the run (model, data)."""
    return {}

  def model_description(self) -> str:
    """The model, as the log names it at the start of a run."""
    return str(self.describe().get("model", self.name))

  def quant_report(self, policy):
    """The `lpjax.quant.Report` of the model's GEMM call sites under `policy` (which are
    quantized, which kept and why; its rules ride along): traced by interception for a
    `model.factory` model, listed from the layers for lpjax's own (`own_model_report`); None
    for a task without GEMM sites."""
    del policy
    return None


def own_model_report(graphdef, *states, scanned=()):
  """The report of one of lpjax's own NNX models (graphdef and abstract states, as the models'
  `abstract_model` gives them): each quantized layer's path and recipe (`lpjax.nn` layer_report);
  `scanned`: paths of its scanned stacks of blocks."""
  from flax import nnx

  from lpjax.nn._layers import layer_report

  return layer_report(nnx.merge(graphdef, *states), scanned=scanned)
