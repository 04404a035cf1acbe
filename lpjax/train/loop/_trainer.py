"""train_and_evaluate(config, workdir): the training program behind train.py.

Builds the mesh, the task (data + model: LLaMA, ResNet or U-Net), the optimizer and the train
state (placed with NamedSharding), resumes from the newest complete checkpoint in the workdir,
trains with periodic evaluation (with the training quantization and with quantization off) and
checkpoints, and writes <workdir>/results.json, metrics.jsonl and TensorBoard event files.

Faults (docs/reliability.md): a non-finite loss, gradient or update (new parameters or optimizer
state) skips the update; after `max_consecutive_skips` skips in a row the run rolls back to the
last checkpoint with the high-precision recipe (`rollback_on_skips`) or stops with an error naming
that checkpoint, so checkpoints only ever hold finite values. SIGTERM / SIGINT
(preemption) write a checkpoint at the end of the current step and exit. A finished run started
again with the same command reports "already complete" and changes nothing.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import jax
import numpy as np

from lpjax.train import config as cfg_lib
from lpjax.train.schema import _preflight as preflight
from lpjax.train.step import _sharding as shd
from lpjax.train.state._checkpoint import CheckpointWriteError, Checkpointer
from lpjax.train.step._compiled_steps import CompiledSteps
from lpjax.train.outputs._metrics import MetricWriter, Progress
from lpjax.train.monitor._monitor import Monitor
from lpjax.train.step._optimizers import learning_rate_schedule, make_optimizer, schedule_change
from lpjax.train.step._precision import PrecisionController
from lpjax.train.schema._quant_rules import check_rules_match
from lpjax.train.loop._process import StopSignals, cpu_allocator_hint, maybe_initialize_distributed
from lpjax.train.outputs._results import read_results, write_results
from lpjax.train.state._resume import StateMismatch, config_changes, flat_config, resolve_mismatch
from lpjax.train.state._segments import Segments
from lpjax.train.step import _step as step_lib
from lpjax.train.step._step import TrainState, init_state, make_train_step
from lpjax.train.tasks import make_task
from lpjax.train.state._workdir_lock import WorkdirLock

FP_RECIPE = "fp32"  # evaluation with quantization off
QUANT_REPORT = "quant_report.txt"  # the call-site report of a run (what each GEMM ran), in the workdir
log = logging.getLogger("lpjax.train")


class TrainingError(RuntimeError):
  """Training cannot continue (e.g. too many non-finite steps in a row)."""


def _global_batch(local_batch: dict, sharding) -> dict:
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}


class Trainer(CompiledSteps):
  """The pieces of one run; `run()` trains. Notebooks can use the pieces directly."""

  def __init__(self, config, workdir: str, *, devices=None):
    maybe_initialize_distributed(config)
    devices = list(devices) if devices is not None else preflight.devices()
    self.config = config = cfg_lib.validate(config, len(devices), jax.process_count())
    self.workdir = os.path.abspath(workdir)
    self.flat_config = flat_config(config)  # recorded in each checkpoint's meta
    self.is_main = jax.process_index() == 0
    preflight.prepare_workdir(self.workdir)  # a file, under a file, read-only: WorkdirError
    self.mesh = shd.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, devices)
    self.precision = PrecisionController(config)  # builds the run's QuantPolicy, once
    with preflight.data_errors():  # a file, a dataset or a package lpjax.data cannot read
      self.task = make_task(config, self.precision.policy, self.workdir)
    preflight.check_dataset(config, self.task.dataset)  # one train and one eval batch, or DataError
    # every GEMM site and what it runs (quant_report.txt); a quant.rules entry that matches no site
    # is a ConfigError here, before anything compiles
    self.quant_sites = self.task.quant_report(self.precision.policy)
    check_rules_match(config.quant.rules, self.quant_sites)
    self.tx = make_optimizer(config, stacked_layers=self.task.stacked_layers)
    self.lr_schedule = learning_rate_schedule(config)  # logged as train/lr
    self.batch_sharding = shd.batch_sharding(self.mesh)
    self._train_step = make_train_step(self.task.loss, self.tx, nan_at_step=config.debug.nan_at_step,
                                       nan_only_quantized=config.debug.nan_only_quantized,
                                       low_precision_policy=self.precision.policy,
                                       grad_accum_steps=config.grad_accum_steps,
                                       param_rounding=config.optimizer.param_rounding,
                                       grad_accum_dtype=config.grad_accum_dtype)
    self._compiled = {}
    self._runners = {}  # (policy, batch shapes) -> the compiled train step
    self.checkpointer = Checkpointer(os.path.join(self.workdir, "checkpoints"),
                                     keep=config.keep_checkpoints)
    self.stop_signal = None  # the signal number that stopped the last run(), if any
    self.compile_seconds = 0.0  # time spent compiling train steps in this process
    self.segments = Segments(None, 0)  # this run's segments (one per process); run() sets it
    self.monitor = Monitor(self)  # config.monitor: per-site numerics, alerts, per-site fallback

  # --- state ----------------------------------------------------------------------------------

  def init_state(self) -> TrainState:
    def init(key, pretrained):
      params, model_state = (self.task.init_variables(key) if pretrained is None else pretrained)
      return init_state(params, model_state, self.tx, loss_scale=self.config.quant.loss_scale)

    key = jax.random.key(self.config.seed)
    pretrained = self.task.pretrained_variables()  # model.init_from: arguments, not constants
    abstract = jax.eval_shape(init, key, pretrained)
    return jax.jit(init, out_shardings=self.state_shardings(abstract))(key, pretrained)

  def state_shardings(self, abstract_state):
    """Params by the partition rules; optimizer moments like the params they mirror."""
    return shd.tree_shardings(abstract_state, self.mesh, self.task.partition_rules)

  def restore_or_init(self):
    """(state, meta): the newest checkpoint's, or a fresh state and {} in an empty workdir.

    A checkpoint of another state structure (another model or optimizer) stops with a ConfigError
    before anything changes, unless config.resume is "restart" or "params"; config changes that
    keep the structure (recipe, schedule, steps) resume and are logged.
    """
    state = self.init_state()
    try:
      step, restored, meta = self.checkpointer.restore_latest(state)
    except StateMismatch as mismatch:
      return resolve_mismatch(self, state, mismatch), {}
    if step is None:
      return state, {}
    meta = meta or {}
    log.info("Resumed from %s at step %d.", self.checkpointer.directory, step)
    if meta.get("config") is not None:
      self.resume_changes = changes = config_changes(meta["config"], self.flat_config)
      if changes and int(step) < self.config.steps:
        log.warning("Resuming step %d with config changes: %s.%s", step, ", ".join(changes),
                    schedule_change(meta["config"], self.config, int(step)))
    return restored, meta

  # --- steps ----------------------------------------------------------------------------------

  def evaluate(self, params, model_state, policy=None) -> dict:
    """{metric: value} of the task's evaluation with `policy` (None: the run's own)."""
    totals = {}
    for local in self.task.eval_batches(jax.process_index(), jax.process_count()):
      sums = self.eval_step(policy)(params, model_state, _global_batch(local, self.batch_sharding))
      for k, v in jax.device_get(sums).items():
        totals[k] = totals.get(k, 0.0) + float(v)
    return self.task.eval_summary(totals)

  # --- the loop -------------------------------------------------------------------------------

  def run(self, *, stop_after: int | None = None) -> dict:
    """Trains to config.steps (or stops after `stop_after` steps, checkpointing there).

    Returns the results (also written to results.json); a run stopped early by `stop_after` or by
    SIGTERM / SIGINT returns {"steps", "stopped": True} after checkpointing. The workdir is
    locked while it runs: a second run in it raises WorkdirInUse at once.
    """
    lock = WorkdirLock(self.workdir).acquire() if self.is_main else None
    try:
      return self._run(stop_after)
    finally:
      if lock is not None:
        lock.release()

  def _run(self, stop_after):
    c = self.config
    start_time = time.time()
    hint = cpu_allocator_hint() if self.mesh.devices.flat[0].platform == "cpu" else None
    if hint and self.is_main:
      log.info(hint)
    state, meta = self.restore_or_init()
    done = self._results_if_complete(state)
    if done is not None:
      return done
    self.segments = Segments(meta.get("segments"), int(state.step), start_time,
                             read_results(self.workdir))  # for results.json
    self._announce_model(state)
    self.precision.load(meta.get("precision", {}))
    self.monitor.start(meta.get("monitor", {}), int(state.step))  # after precision: sets its policy
    rollbacks = int(meta.get("rollbacks", 0))
    writer = MetricWriter(self.workdir, enabled=self.is_main, resume_step=int(state.step))
    if self.is_main:
      with open(os.path.join(self.workdir, "config.json"), "w") as f:
        f.write(c.to_json_best_effort(indent=2))
    end_step = min(c.steps, stop_after) if stop_after else c.steps
    units = int(meta.get("units", 0))
    last_loss, eval_metrics = float("nan"), {}
    try:
      with StopSignals() as signals:
        while True:
          try:
            state, units, last_loss, eval_metrics = self._train_until(
                state, end_step, units, rollbacks, writer, signals)
            break
          except _Rollback as rb:
            rollbacks += 1
            state, units = rb.state, rb.units
        self.stop_signal = signals.received
    except BaseException:
      try:  # let writes in flight finish; the error that stopped the run is the one to report
        self.checkpointer.wait()
      except CheckpointWriteError:
        pass
      raise
    self.checkpointer.wait()
    self.final_state = state
    self.monitor.finish()
    if int(state.step) < c.steps:
      self.checkpointer.close()
      writer.close()
      return {"steps": int(state.step), "stopped": True, "signal": self.stop_signal}
    if not eval_metrics or eval_metrics.get("step") != int(state.step):
      eval_metrics = self._eval_and_log(state, int(state.step), writer)
    self.checkpointer.close()
    writer.close()
    results = {"steps": int(state.step), self.task.unit: int(units),
               "final_train_loss": last_loss}
    for k, v in eval_metrics.items():
      if k != "step":
        results["final_" + k.replace("/", "_")] = v
    results.update(skipped_steps=int(state.skipped), rollbacks=rollbacks,
                   **self.segments.results(int(state.step), self.compile_seconds),
                   task=c.task, recipe=c.quant.recipe,
                   optimizer=c.optimizer.name, **self.task.describe(), **self.monitor.results())
    if self.is_main:
      results = write_results(self.workdir, results)
    return results

  def _announce_model(self, state):
    """Logs the model and its parameter count, and the call-site report of the run's policy,
    which it writes to <workdir>/quant_report.txt: which GEMMs are quantized, which kept in high
    precision, and why (every task, lpjax's own models and model.factory ones)."""
    if not self.is_main:
      return
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
    log.info("Model: %s, %s parameters.", self.task.model_description(), f"{count:,}")
    report = self.quant_sites
    if report is not None:
      how = ("model.factory, quantized by interception; traced on one example"
             if getattr(self.task, "user", None) is not None else
             "lpjax's own layers, each under the run's policy; block 'scan': one path for every "
             "block of a scanned stack")
      text = f"GEMM call sites of recipe {self.config.quant.recipe} ({how}):\n{report}\n"
      log.info("%s", text.rstrip())
      with open(os.path.join(self.workdir, QUANT_REPORT), "w") as f:
        f.write(text)

  def _results_if_complete(self, state):
    """The saved results when the workdir's run already reached config.steps, else None.

    A finished run rerun with the same command touches nothing (results.json, metrics.jsonl,
    checkpoints) and returns its results; with more steps it continues from the checkpoint.
    """
    if int(state.step) < self.config.steps:
      return None
    results = read_results(self.workdir)
    if results is None or results.get("steps") != int(state.step):
      return None
    changes = [c for c in getattr(self, "resume_changes", []) if not c.startswith("steps ")]
    if changes:  # another experiment asked of a finished run: it belongs in a new workdir
      log.warning("The run in %s is already complete (step %d of %d) with another config than "
                  "this command's (%s); nothing was changed. To train with this config, give a "
                  "new --workdir (e.g. %s-2); to train this run further, raise --config.steps.",
                  self.workdir, int(state.step), self.config.steps, ", ".join(changes[:4]) +
                  (", ..." if len(changes) > 4 else ""), self.workdir.rstrip(os.sep))
    else:
      log.info("The run in %s is already complete (step %d of %d); nothing was changed. Raise "
               "--config.steps to train further.", self.workdir, int(state.step), self.config.steps)
    self.final_state = state
    self.checkpointer.close()
    return results

  def _meta(self, units, rollbacks, segments=()):
    return {"precision": self.precision.dump(), "units": int(units), "rollbacks": rollbacks,
            "config": self.flat_config, "monitor": self.monitor.dump(),
            "segments": list(segments)}

  def _train_until(self, state, end_step, units, rollbacks, writer, signals):
    """Steps to end_step; returns (state, units, last logged loss, last eval metrics)."""
    c = self.config
    start_step = int(state.step)
    progress = Progress(start_step, c.steps, 0, c.progress_bar and self.is_main,
                        unit=self.task.unit)
    batches = self.task.batches(start_step, end_step - start_step, jax.process_index(),
                                jax.process_count())
    key = jax.random.key(c.seed + 1)
    last_loss, eval_metrics, skipped_logged = float("nan"), {}, int(state.skipped)
    units_at_log = units
    for step, local in batches:
      policy = self.precision.policy_at(step)
      batch = _global_batch(local, self.batch_sharding)
      compiled_before = self.compile_seconds
      state, metrics = self.one_step(step, state, batch, key, policy, writer)
      progress.exclude(self.compile_seconds - compiled_before)  # the ETA counts steady steps
      units += self.task.units_in(local)
      done = step + 1
      if done % c.log_every == 0 or done == end_step or signals.received:
        m = jax.device_get(metrics)
        last_loss = float(m["loss"])
        self.precision.observe(step, last_loss)
        progress.units_per_step = (units - units_at_log) / max(done - progress.last_step, 1)
        units_at_log = units
        per_second = progress.update(done, last_loss)
        skipped = int(state.skipped)
        scalars = {"train/loss": last_loss, "train/grad_norm": float(m["grad_norm"]),
                   "train/lr": float(self.lr_schedule(step)),
                   f"train/{self.task.unit}_per_second": per_second, "train/skipped": skipped,
                   "train/recipe_is_quantized": float(self.precision.is_low_precision(policy))}
        scalars.update({f"train/{k}": float(v) for k, v in m.items()
                        if k not in ("loss", "grad_norm", "finite", "update_finite")})
        writer.write(done, scalars)
        self.checkpointer.check()  # a failed async checkpoint write stops the run here
        if skipped > skipped_logged:
          why = ("a non-finite loss or gradient" if bool(m.get("update_finite", True))
                 else "a non-finite update (new parameters or optimizer state; check optimizer.lr "
                      "and the optimizer's hyperparameters)")
          log.warning("step %d: %d update(s) skipped for %s (%d in total).", done,
                      skipped - skipped_logged, why, skipped)
          skipped_logged = skipped
        if int(state.consecutive_skips) >= c.max_consecutive_skips:
          progress.close()
          self._too_many_skips(state, done, rollbacks, writer)  # raises _Rollback or TrainingError
      if c.eval_every and done % c.eval_every == 0 and done != c.steps:
        eval_metrics = self._eval_and_log(state, done, writer)
        progress.restart_clock()
      if ((c.checkpoint_every and done % c.checkpoint_every == 0) or done == end_step
          or signals.received):
        self._save(done, state, units, rollbacks, self._ending(done, end_step, signals))
      if signals.received:
        log.warning("Stopped by %s at step %d; the checkpoint resumes from there.",
                    signal.Signals(signals.received).name, done)
        break
    progress.close()
    return state, units, last_loss, eval_metrics

  def _save(self, step, state, units, rollbacks, ending=("running", None)):
    """Checkpoints `state`. Its parameters and optimizer state are finite by construction: the
    train step never applies a non-finite update (and a rollback verifies what it restores).
    `ending`: (how this segment stands, the signal that stopped it), for the run's segments."""
    segments = self.segments.dump(step, self.compile_seconds, *ending)
    self.checkpointer.save(step, state, self._meta(units, rollbacks, segments))

  def _ending(self, done, end_step, signals):
    """(ended, signal name) of this segment at a checkpoint of step `done` (_segments.ENDINGS,
    or "running" before its end)."""
    if signals.received:
      return "interrupted", signal.Signals(signals.received).name
    if done >= self.config.steps:
      return "finished", None
    return ("stopped" if done == end_step else "running"), None

  def _too_many_skips(self, state, done, rollbacks, writer):
    c = self.config
    self.checkpointer.wait()
    last_good = self.checkpointer.latest_step()
    if c.rollback_on_skips and rollbacks < c.max_rollbacks and last_good is not None:
      template = self.init_state()
      step, restored, meta = self.checkpointer.restore_latest(template)
      if not bool(step_lib.all_finite_floats((restored.params, restored.opt_state))):
        raise TrainingError(  # only a checkpoint written before saves were verified can be
            f"{int(state.consecutive_skips)} non-finite steps in a row at step {done}, and the "
            f"checkpoint of step {step} holds non-finite values, so there is nothing good to roll "
            f"back to in {self.checkpointer.directory}. Start a new workdir.")
      self.precision.load(meta.get("precision", {}))
      self.monitor.rolled_back(meta.get("monitor", {}), step)
      self.precision.force_fallback(step)
      log.warning("%d non-finite steps in a row at step %d: rolled back to the checkpoint of step "
                  "%d; the next %d steps use %s (rollback %d of at most %d).",
                  int(state.consecutive_skips), done, step, c.quant.fallback_steps,
                  c.quant.high_precision_recipe, rollbacks + 1, c.max_rollbacks)
      writer.write(done, {"event/rollback_to_step": step})  # steps after it are logged again
      raise _Rollback(restored, int(meta.get("units", 0)))
    where = (f"step {last_good} in {self.checkpointer.directory}" if last_good is not None
             else "none (no checkpoint was written yet)")
    raise TrainingError(
        f"{int(state.consecutive_skips)} non-finite steps in a row at step {done}; the last good "
        f"checkpoint is {where}. Lower optimizer.lr, set quant.loss_scale=True, use "
        "quant.fallback_factor, or rollback_on_skips=True to restart from it in "
        "quant.high_precision_recipe.")

  def _eval_and_log(self, state, step, writer) -> dict:
    quantized = self.evaluate(state.params, state.model_state, None)
    full = self.evaluate(state.params, state.model_state,
                         self.precision.policy.with_recipe(FP_RECIPE))
    metrics = {f"eval/{k}": v for k, v in quantized.items()}
    metrics.update({f"eval/{k}_fp": v for k, v in full.items()})
    metrics.update({f"eval/{k}": v for k, v in self.task.after_eval(
        state.params, state.model_state, step, self.workdir, self.is_main).items()})
    writer.write(step, metrics)
    log.info("step %d: eval %s", step, ", ".join(f"{k[5:]} {v:.4g}" for k, v in metrics.items()))
    return {"step": step, **metrics}


class _Rollback(Exception):
  def __init__(self, state, units):
    super().__init__("rollback")
    self.state, self.units = state, units


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains `config` in `workdir` (resuming if it holds checkpoints); returns results.json."""
  return Trainer(config, workdir).run()
