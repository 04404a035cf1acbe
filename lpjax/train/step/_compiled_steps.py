"""The train and eval steps of a Trainer, jitted once per policy and compiled ahead of time.

`CompiledSteps` is a part of `lpjax.train.loop._trainer.Trainer` (a base class): it expects the
Trainer's `config`, `mesh`, `precision`, `task`, `monitor`, `_train_step` (from
`lpjax.train.step._step.make_train_step`), `_compiled` / `_runners` (caches) and `compile_seconds`.
`one_step` runs step `step`: the plain train step, or every `monitor.every` steps the monitor's
measured step (the same update, with the statistics of every quantized site).
"""

from __future__ import annotations

import logging
import time

import jax

from lpjax.train.step import _sharding as shd

log = logging.getLogger("lpjax.train")


class CompiledSteps:
  """The Trainer's compiled steps (see the module docstring)."""

  def activation_hints(self):
    """The context the steps are traced in: the model's activation hints map onto the mesh, and
    (quant.gather_quantized_weights) FSDP gathers quantized weights as codes and scales."""
    return shd.step_hints(self.mesh,
                          gather_quantized_weights=self.config.quant.gather_quantized_weights)

  def train_step(self, policy=None, sites=None):
    """The jitted train step of `policy` (a QuantPolicy; None: the run's own), compiled once;
    with `sites` (the monitor's, for this policy and batch shapes), the measured step."""
    policy = self.precision.policy if policy is None else policy
    name = ("train", policy) if sites is None else ("measured", policy, id(sites))
    if name not in self._compiled:
      def step(state, batch, key):
        with self.activation_hints():
          if sites is None:
            return self._train_step(state, batch, key, policy)
          return self._train_step(state, batch, key, policy, sites)
      self._compiled[name] = jax.jit(step, donate_argnums=(0,))
    return self._compiled[name]

  def eval_step(self, policy=None):
    policy = self.precision.policy if policy is None else policy
    if ("eval", policy) not in self._compiled:
      def sums(params, model_state, batch):
        with self.activation_hints():
          return self.task.eval_sums(params, model_state, batch, policy)
      self._compiled[("eval", policy)] = jax.jit(sums)
    return self._compiled[("eval", policy)]

  def compiled_train_step(self, policy, state, batch, key, sites=None):
    """The train step of `policy` compiled for these shapes: compiled once ahead of time, with
    the compile time logged ("compiled in N s"), then reused for every step of the same shapes.
    With `sites`, the monitor's measured step of those sites (Trainer.train_step).

    Should a later call come with other input shardings than the compiled ones (the executable
    checks before it runs, so nothing is donated), the entry falls back to the jitted step."""
    shapes = jax.tree.map(lambda a: (a.shape, str(a.dtype)), batch)
    cache_key = (policy, str(shapes), None if sites is None else id(sites))
    if cache_key not in self._runners:
      name = f"{policy.recipe} (forward only)" if policy.forward_only else policy.recipe
      what = "train step" if sites is None else "measured train step (monitor)"
      log.info("Compiling the %s for recipe %s.", what, name)
      start = time.perf_counter()
      executable = self.train_step(policy, sites).lower(state, batch, key).compile()
      seconds = time.perf_counter() - start
      log.info("%s for recipe %s compiled in %.1f s.", what.capitalize(), name, seconds)
      self.compile_seconds += seconds
      jitted, fell_back = self.train_step(policy, sites), []

      def run(state, batch, key):
        if not fell_back:
          try:
            return executable(state, batch, key)
          except ValueError as e:  # input shardings differ from the compiled ones
            log.info("Train step inputs changed sharding (%s); using the jitted step.", e)
            fell_back.append(True)
        return jitted(state, batch, key)
      self._runners[cache_key] = run
    return self._runners[cache_key]

  def one_step(self, step: int, state, batch, key, policy, writer):
    """(state, metrics) after train step `step` of `policy` (compiled when new): the plain step,
    or every monitor.every steps the monitor's measured step, whose statistics it records."""
    sites = self.monitor.sites_to_measure(step, state, batch, key, policy)
    run_step = self.compiled_train_step(policy, state, batch, key, sites)
    if sites is None:
      return run_step(state, batch, key)
    jax.block_until_ready(state)  # the queued steps finish first: their time is not the monitor's
    started = time.perf_counter()
    state, metrics, measured = run_step(state, batch, key)
    self.monitor.record(step, sites, measured, writer, started)
    return state, metrics

