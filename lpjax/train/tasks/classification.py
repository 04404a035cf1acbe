"""Image classification with a ResNet: cross-entropy, top-1 / top-5 accuracy at eval.

BatchNorm statistics are the task's model state (updated in train mode, frozen at eval); the
trainer checkpoints and shards them with the parameters.

Examples:
  >>> from lpjax.train.cli._vision_configs import vision_config
  >>> c = vision_config("resnet_tiny", recipe="bf16")
  >>> c.batch_size, c.data.prefetch = 4, 0
  >>> task = ClassificationTask(c)
  >>> step, batch = next(task.batches(3, 1, 0, 1))
  >>> step, batch["image"].shape, task.model_config.stem, task.model_config.num_classes
  (3, (4, 8, 8, 1), 'small', 10)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from lpjax.models import resnet
from lpjax.train.tasks.base import own_model_report
from lpjax.train.tasks.images import ImageTask
from lpjax.train.model._user_model import Expected, user_model

SMALL_IMAGES = 64  # images up to this side get the small (3x3/1, no max-pool) stem by default


class ClassificationTask(ImageTask):
  name = "classification"
  partition_rules = resnet.PARTITION_RULES

  def __init__(self, config, policy=None):
    super().__init__(config, policy)
    m = config.model
    height, _, channels = self.dataset.image_shape
    self.model_config = resnet.ResNetConfig(
        name=m.name, num_classes=m.num_classes or self.dataset.num_classes, in_channels=channels,
        stem=m.stem or ("small" if height <= SMALL_IMAGES else "imagenet"),
        compute_dtype=m.compute_dtype, param_dtype=m.param_dtype)
    # the user's own model (model.factory), its GEMMs quantized by interception; else a ResNet
    classes = self.model_config.num_classes
    self.user = user_model(config, dict(num_classes=classes,
                                        image_shape=tuple(self.dataset.image_shape)),
                           jnp.zeros((1,) + tuple(self.dataset.image_shape), jnp.float32),
                           Expected("(batch, num_classes)", (2, classes), "model.num_classes"))
    if self.user is not None:
      self.partition_rules = self.user.partition_rules
      self._apply = self._user_apply
      return
    self.graphdef, _, _ = resnet.abstract_model(self.model_config, self.policy)
    self._apply = functools.partial(resnet.apply, self.graphdef, self.model_config)

  def _user_apply(self, params, model_state, images, policy, key, *, train):
    return self.user.apply(params, model_state, images,
                           policy if policy is not None else self.policy, key, train=train)

  def stacked_layers(self, params):
    if self.user is not None:
      return self.user.stacked_layers(params)
    return super().stacked_layers(params)

  def init_variables(self, key):
    if self.user is not None:
      return self.user.init_variables(key)
    return resnet.init_variables(self.model_config, key)

  def loss(self, params, model_state, batch, key, policy):
    logits, new_stats = self._apply(params, model_state, batch["image"], policy, key, train=True)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
    accuracy = jnp.mean((jnp.argmax(logits, -1) == batch["label"]).astype(jnp.float32))
    return loss, (new_stats, {"accuracy": accuracy})

  def eval_sums(self, params, model_state, batch, policy):
    logits, _ = self._apply(params, model_state, batch["image"], policy, jax.random.key(0),
                            train=False)
    mask, labels = batch["mask"], batch["label"]
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    k = min(5, logits.shape[-1])
    top5 = jnp.any(jax.lax.top_k(logits, k)[1] == labels[:, None], axis=-1)
    return {"loss_sum": jnp.sum(losses * mask),
            "top1_sum": jnp.sum((jnp.argmax(logits, -1) == labels) * mask),
            "top5_sum": jnp.sum(top5 * mask), "count": jnp.sum(mask)}

  def eval_summary(self, sums):
    n = max(sums["count"], 1.0)
    return {"loss": sums["loss_sum"] / n, "top1": sums["top1_sum"] / n, "top5": sums["top5_sum"] / n}

  def describe(self):
    model = {"model": self.config.model.factory} if self.user is not None else {}
    return {**super().describe(), **model, "eval_examples": self.dataset.eval_size}

  def model_description(self):
    return self.user.describe() if self.user is not None else super().model_description()

  def quant_report(self, policy):
    if self.user is not None:
      return self.user.report(policy)
    return own_model_report(*resnet.abstract_model(self.model_config, policy))
