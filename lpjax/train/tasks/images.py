"""What the image tasks (classification, diffusion) share: the dataset from the config's `data`
section, training batches from (seed, step), and the evaluation batches.

Examples:
  >>> from lpjax.train.cli._vision_configs import vision_config
  >>> c = vision_config("resnet_tiny")
  >>> c.batch_size, c.eval_steps = 100, 0
  >>> len(list(_Demo(c).eval_batches(0, 1)))   # the 360 digits test images, 100 at a time
  4
"""

from __future__ import annotations

from lpjax.data import make_image_dataset, step_iterator
from lpjax.train.tasks.base import Task


class ImageTask(Task):
  """Sets self.dataset; subclasses build their model from self.dataset.image_shape."""

  unit = "images"

  def __init__(self, config, policy=None):
    self.config = config
    self._set_policy(config, policy)
    d = config.data
    self.dataset = make_image_dataset(d.source, tfds_name=d.tfds_name,
                                      data_dir=d.tfds_data_dir or None, image_size=d.image_size,
                                      classes=d.classes, augment=d.augment,
                                      cache_dir=d.cache_dir or None)

  def batches(self, start_step, num_steps, process_index, process_count):
    c = self.config
    make = lambda step: self.dataset.train_batch(step, c.batch_size, c.seed, process_index,
                                                 process_count)
    return step_iterator(make, start_step=start_step, num_steps=num_steps, prefetch=c.data.prefetch)

  def units_in(self, local_batch):
    return self.config.batch_size

  def eval_batches(self, process_index, process_count):
    """The eval split in order (the last batch padded, "mask" 0 on padding); eval_steps > 0 caps
    the number of batches."""
    c = self.config
    n = self.dataset.num_eval_batches(c.batch_size)
    for i in range(min(n, c.eval_steps) if c.eval_steps else n):
      yield self.dataset.eval_batch(i, c.batch_size, process_index, process_count)

  def describe(self):
    return {"model": self.config.model.name, "dataset": self.dataset.name}


class _Demo(ImageTask):  # for the example above: the abstract parts, unused
  name = "demo"
  init_variables = loss = eval_sums = eval_summary = None
