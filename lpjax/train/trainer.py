"""train_and_evaluate(config, workdir): the training program behind train.py.

Builds the mesh, data, model, optimizer and train state (placed with NamedSharding), resumes
from the newest complete checkpoint in the workdir, trains with periodic evaluation (with the
training quantization and with quantization off) and checkpoints, and writes
<workdir>/results.json, metrics.jsonl and TensorBoard event files.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from lpjax import data as lpdata
from lpjax import optim
from lpjax.models import llama
from lpjax.train import config as cfg_lib
from lpjax.train import sharding as shd
from lpjax.train.checkpoint import Checkpointer
from lpjax.train.metrics import MetricWriter, Progress
from lpjax.train.optimizers import make_optimizer
from lpjax.train.precision import PrecisionController
from lpjax.train.step import TrainState, make_eval_step, make_train_step

FP_RECIPE = "fp32"  # evaluation with quantization off
log = logging.getLogger("lpjax.train")


class TrainingError(RuntimeError):
  """Training cannot continue (e.g. too many non-finite steps in a row)."""


def _maybe_initialize_distributed(config):
  d = config.distributed
  if not d.initialize:
    return
  kwargs = {}
  if d.coordinator_address:
    kwargs["coordinator_address"] = d.coordinator_address
  if d.num_processes > 0:
    kwargs["num_processes"] = d.num_processes
  if d.process_id >= 0:
    kwargs["process_id"] = d.process_id
  jax.distributed.initialize(**kwargs)


def _global_batch(local_batch: dict, sharding) -> dict:
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}


class Trainer:
  """The pieces of one run; `run()` trains. Notebooks can use the pieces directly."""

  def __init__(self, config, workdir: str, *, devices=None):
    _maybe_initialize_distributed(config)
    devices = list(devices) if devices is not None else jax.devices()
    self.config = config = cfg_lib.validate(config, len(devices), jax.process_count())
    self.workdir = os.path.abspath(workdir)
    self.is_main = jax.process_index() == 0
    os.makedirs(self.workdir, exist_ok=True)
    self.mesh = shd.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, devices)
    d = config.data
    self.dataset = lpdata.make_dataset(d.source, path=d.path, tfds_name=d.tfds_name,
                                       tokenizer=d.tokenizer, tfds_data_dir=d.tfds_data_dir or None,
                                       cache_dir=d.cache_dir or None, text_key=d.text_key)
    self.model_config = llama.LlamaConfig.from_config(config, self.dataset.vocab_size)
    self.graphdef, _ = llama.abstract_model(self.model_config)
    self.tx = make_optimizer(config)
    self.batch_sharding = shd.batch_sharding(self.mesh)
    self.replicated = shd.replicated(self.mesh)
    self.precision = PrecisionController(config)
    apply_fn = functools.partial(llama.apply, self.graphdef, self.model_config)
    self._train_step = make_train_step(apply_fn, self.tx, nan_at_step=config.debug.nan_at_step,
                                       grad_accum_steps=config.grad_accum_steps)
    self._eval_step = make_eval_step(apply_fn)
    self._compiled = {}
    self.checkpointer = Checkpointer(os.path.join(self.workdir, "checkpoints"),
                                     keep=config.keep_checkpoints)

  # --- state ----------------------------------------------------------------------------------

  def init_state(self) -> TrainState:
    key = jax.random.key(self.config.seed)

    def init(key):
      params = llama.init_params(self.model_config, key)
      loss_scale = optim.DynamicLossScale() if self.config.quant.loss_scale else None
      zero = jnp.zeros([], jnp.int32)
      return TrainState(step=zero, params=params, opt_state=self.tx.init(params),
                        loss_scale=loss_scale, skipped=zero, consecutive_skips=zero)

    abstract = jax.eval_shape(init, key)
    shardings = self.state_shardings(abstract)
    return jax.jit(init, out_shardings=shardings)(key)

  def state_shardings(self, abstract_state):
    """Params by the partition rules; optimizer moments like the params they mirror."""
    return shd.tree_shardings(abstract_state, self.mesh, llama.PARTITION_RULES)

  def restore_or_init(self):
    state = self.init_state()
    step, restored, meta = self.checkpointer.restore_latest(state)
    if step is None:
      return state, {}
    log.info("Resumed from %s at step %d.", self.checkpointer.directory, step)
    return restored, meta or {}

  # --- steps ----------------------------------------------------------------------------------

  def train_step(self, recipe: str):
    if ("train", recipe) not in self._compiled:
      log.info("Compiling the train step for recipe %s.", recipe)
      fn = functools.partial(self._train_step, recipe=recipe)
      self._compiled[("train", recipe)] = jax.jit(fn, donate_argnums=(0,))
    return self._compiled[("train", recipe)]

  def eval_step(self, recipe: str):
    if ("eval", recipe) not in self._compiled:
      self._compiled[("eval", recipe)] = jax.jit(functools.partial(self._eval_step, recipe=recipe))
    return self._compiled[("eval", recipe)]

  def evaluate(self, params, recipe: str) -> tuple[float, float]:
    c = self.config
    total, count = 0.0, 0
    for i in range(c.eval_steps):
      local = self.dataset.eval_batch(i, c.batch_size, c.seq_len, jax.process_index(),
                                      jax.process_count())
      loss_sum, n = self.eval_step(recipe)(params, _global_batch(local, self.batch_sharding))
      total += float(loss_sum)
      count += int(n)
    loss = total / max(count, 1)
    return loss, math.exp(min(loss, 50.0))

  # --- the loop -------------------------------------------------------------------------------

  def run(self, *, stop_after: int | None = None) -> dict:
    """Trains to config.steps (or stops after `stop_after` steps, checkpointing there)."""
    c = self.config
    start_time = time.time()
    state, meta = self.restore_or_init()
    start_step = int(state.step)
    self.precision.load(meta.get("precision", {}))
    writer = MetricWriter(self.workdir, enabled=self.is_main)
    if self.is_main:
      with open(os.path.join(self.workdir, "config.json"), "w") as f:
        f.write(c.to_json_best_effort(indent=2))
    tokens_per_step = c.batch_size * c.seq_len
    progress = Progress(start_step, c.steps, tokens_per_step, c.progress_bar and self.is_main)
    batches = lpdata.batch_iterator(
        self.dataset, start_step=start_step, batch_size=c.batch_size, seq_len=c.seq_len,
        seed=c.seed, process_index=jax.process_index(), process_count=jax.process_count(),
        num_steps=(min(c.steps, stop_after) if stop_after else c.steps) - start_step,
        prefetch=c.data.prefetch,
        seq_len_at=lambda s: cfg_lib.seq_len_at(c, s))
    key = jax.random.key(c.seed + 1)
    last_loss, eval_metrics = float("nan"), {}
    tokens = start_step * tokens_per_step
    for step, local in batches:
      recipe = self.precision.recipe_at(step)
      state, metrics = self.train_step(recipe)(state, _global_batch(local, self.batch_sharding), key)
      tokens += local["inputs"].shape[1] * c.batch_size
      done = step + 1
      if done % c.log_every == 0 or done == c.steps:
        m = jax.device_get(metrics)
        last_loss = float(m["loss"])
        self.precision.observe(step, last_loss)
        consecutive = int(state.consecutive_skips)
        tok_s = progress.update(done, last_loss)
        writer.write(done, {"train/loss": last_loss, "train/grad_norm": float(m["grad_norm"]),
                            "train/tokens_per_second": tok_s, "train/skipped": int(state.skipped),
                            "train/recipe_is_quantized": float(recipe != c.quant.high_precision_recipe)})
        if consecutive >= c.max_consecutive_skips:
          self.checkpointer.wait()
          raise TrainingError(
              f"{consecutive} non-finite steps in a row at step {done}; the last good checkpoint is "
              f"step {self.checkpointer.latest_step()} in {self.checkpointer.directory}. Lower the "
              "learning rate or use quant.high_precision_recipe / quant.fallback_factor.")
      if c.eval_every and done % c.eval_every == 0 and done != c.steps:
        eval_metrics = self._eval_and_log(state.params, done, writer)
        progress.restart_clock()
      if (c.checkpoint_every and done % c.checkpoint_every == 0) or done in (c.steps, stop_after):
        self.checkpointer.save(done, state, {"precision": self.precision.dump()})
    progress.close()
    if stop_after is not None and int(state.step) < c.steps:
      self.checkpointer.close()
      writer.close()
      self.final_state = state
      return {"steps": int(state.step), "stopped": True}
    if int(state.step) != start_step or not eval_metrics:
      eval_metrics = self._eval_and_log(state.params, int(state.step), writer)
    self.checkpointer.close()
    writer.close()
    results = {
        "steps": int(state.step), "tokens": int(tokens), "final_train_loss": last_loss,
        "final_eval_loss": eval_metrics["eval/loss"], "final_eval_ppl": eval_metrics["eval/ppl"],
        "final_eval_loss_fp": eval_metrics["eval/loss_fp"],
        "final_eval_ppl_fp": eval_metrics["eval/ppl_fp"],
        "skipped_steps": int(state.skipped), "wall_time_s": time.time() - start_time,
        "recipe": c.quant.recipe, "optimizer": c.optimizer.name, "model": c.model.size,
    }
    if self.is_main:
      with open(os.path.join(self.workdir, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    self.final_state = state
    return results

  def _eval_and_log(self, params, step, writer) -> dict:
    loss_q, ppl_q = self.evaluate(params, self.config.quant.recipe)
    loss_fp, ppl_fp = self.evaluate(params, FP_RECIPE)
    metrics = {"eval/loss": loss_q, "eval/ppl": ppl_q, "eval/loss_fp": loss_fp, "eval/ppl_fp": ppl_fp}
    writer.write(step, metrics)
    log.info("step %d: eval loss %.4f (ppl %.2f), full precision %.4f", step, loss_q, ppl_q, loss_fp)
    return metrics


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains `config` in `workdir` (resuming if it holds checkpoints); returns results.json."""
  return Trainer(config, workdir).run()


def setup_logging():
  """lpjax's INFO lines on stderr; other libraries (orbax, absl) at WARNING."""
  try:
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)
  except ImportError:
    pass
  logger = logging.getLogger("lpjax")
  if not logger.handlers:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False
