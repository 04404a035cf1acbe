"""Numerics of every quantized operand of every GEMM of a trained LLaMA run: X, W and dY, per layer.

    python benchmarks/studies/operand_telemetry.py --workdir=runs/ablate/operands/all/seed0
    python benchmarks/studies/operand_telemetry.py --workdir=DIR --recipe=nvfp4 --batches=2 --json=out.json

Restores the newest checkpoint of a finished (or running) tiny-LLaMA workdir, runs the loss and its
gradient on training batches, and measures each of the six operand quantizations of every QDense
(q, k, v, o, gate, up, down of every block) with `lpjax.quant`'s operand statistics, on exactly
the tensors the recipe quantizes there (after its RHT and SR pre-scale):

| GEMM | lhs | rhs |
|---|---|---|
| fwd   Y  = X W      | X along K (features in)  | W along K |
| dgrad dX = dY W^T   | dY along N (features out) | W along N |
| wgrad dW = X^T dY   | X along M (tokens)        | dY along M |

dY is the cotangent of the layer's output, captured by an identity with a custom gradient. The
statistics (snr_db, frac_saturated, frac_flushed) come back through `jax.debug.callback`; a
scanned model reports one value per block, in block order. `--recipe` runs this forward and
backward with another recipe in the run's policy (the layers it keeps in high precision stay so);
the default is the run's own recipe.

The QDense forward is re-stated here (as `lpjax.nn.QDense.__call__`: promote, recipe, key,
dot_general, bias) so the probe can sit on its output; the GEMM itself is unchanged.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from lpjax import quant
from lpjax.nn import _layers
from lpjax.quant.gemm import operand as opq
from lpjax.quant.gemm.dot_general import gemm_signs
from lpjax.quant.recipes.gemm_recipe import OperandQuant
from lpjax.train import config as cfg_lib
from lpjax.train.loop._trainer import Trainer

# (gemm, side, tensor, axis of the 2-D (M, K) / (K, N) / (M, N) operand it is blocked along)
PLACES = (("fwd", "lhs", "X", -1), ("fwd", "rhs", "W", 0), ("dgrad", "lhs", "dY", -1),
          ("dgrad", "rhs", "W", -1), ("wgrad", "lhs", "X", 0), ("wgrad", "rhs", "dY", 0))
STATS = ("snr_db", "frac_saturated", "frac_flushed")


def _operand_stats(recipe, key, tensors: dict) -> dict:
  """{(gemm, side): stats} of every quantized operand whose tensor (X, W or dY, 2-D) is given."""
  out = {}
  for gemm, side, name, axis in PLACES:
    op = getattr(getattr(recipe, gemm), side)
    if name not in tensors or not isinstance(op, OperandQuant):
      continue
    signs, block = gemm_signs(key, recipe, gemm)
    out[(gemm, side)] = opq.stats(tensors[name], op, axis=axis,
                                  key=opq.operand_key(key, gemm, 0 if side == "lhs" else 1),
                                  signs=signs, block=block)
  return out


class Recorder:
  """Collects (path, gemm, side) -> list of stats dicts, in the order the device reports them."""

  def __init__(self):
    self.values = collections.defaultdict(list)

  def sink(self, path, stats):
    def record(values):
      for (gemm, side), s in values.items():
        self.values[(path, gemm, side)].append({k: float(v) for k, v in s.items()})
    return lambda: jax.debug.callback(record, stats)


def _probed_call(recorder: Recorder):
  """A QDense.__call__ that reports its operands' statistics (forward ones now, dY's in the
  backward pass)."""

  def call(self, x, *, key=None):
    x, kernel, bias, recipe, key = self._prepare(x, key)
    dn = (((x.ndim - 1,), (0,)), ((), ()))
    x2 = jax.lax.stop_gradient(x.reshape(-1, x.shape[-1]).astype(jnp.float32))
    w2 = jax.lax.stop_gradient(kernel.astype(jnp.float32))
    if not recipe.is_high_precision:
      recorder.sink(self.path, _operand_stats(recipe, key, {"X": x2, "W": w2}))()
    y = quant.dot_general(x, kernel, dn, recipe, key=key, rhs_axes=self.kernel_axes)
    if not recipe.is_high_precision:
      y = _grad_probe(y, key, recipe, self.path, recorder)
    return y if bias is None else y + bias

  return call


def _grad_probe(y, key, recipe, path, recorder):
  """y, unchanged; its cotangent dY is measured in the backward pass."""

  @jax.custom_vjp
  def probe(y, key):
    return y

  def fwd(y, key):
    return y, key

  def bwd(key, g):
    g2 = g.reshape(-1, g.shape[-1]).astype(jnp.float32)
    recorder.sink(path, _operand_stats(recipe, key, {"dY": g2}))()
    return g, None

  probe.defvjp(fwd, bwd)
  return probe(y, key)


def load_config(workdir: str):
  """The run's config.json over today's defaults (keys added since the run keep their default)."""
  with open(os.path.join(workdir, "config.json")) as f:
    saved = json.load(f)
  config = cfg_lib.base_config(saved["task"], optimizer=saved["optimizer"]["name"])
  config.update(saved)
  return config


def measure(workdir: str, *, recipe: str | None = None, batches: int = 1) -> dict:
  """{(path, gemm, side): {stat: [value per block]}} averaged over `batches` training batches."""
  config = load_config(workdir)
  config.progress_bar = False
  config.model.remat = False  # a recomputed forward would report its operands twice
  trainer = Trainer(config, workdir)
  state, _ = trainer.restore_or_init()
  recorder = Recorder()
  original = _layers.QDense.__call__
  _layers.QDense.__call__ = _probed_call(recorder)
  try:
    policy = trainer.precision.policy
    policy = policy.with_recipe(recipe) if recipe else policy
    loss = lambda p, b, k: trainer.task.loss(p, state.model_state, b, k, policy)[0]
    grad = jax.jit(jax.grad(loss))
    it = trainer.task.batches(int(state.step), batches, 0, 1)
    for i, (_, batch) in zip(range(batches), it):
      jax.block_until_ready(grad(state.params, batch, jax.random.key(1000 + i)))
  finally:
    _layers.QDense.__call__ = original
  out = {}
  for place, rows in recorder.values.items():
    per, extra = divmod(len(rows), batches)  # values per batch: one per block of a scanned model
    if extra:
      raise RuntimeError(f"{place}: {len(rows)} reports for {batches} batches; expected a "
                         "multiple.")
    blocks = [rows[b * per:(b + 1) * per] for b in range(batches)]
    out[place] = {s: list(np.mean([[r[s] for r in blk] for blk in blocks], axis=0)) for s in STATS}
  return {"step": int(state.step), "recipe": recipe or config.quant.recipe, "places": out}


def table(result: dict) -> str:
  """Markdown: per layer kind and operand, the mean over blocks (and the worst block's SNR)."""
  lines = [f"step {result['step']}, recipe `{result['recipe']}`; mean over blocks (min for SNR)",
           "", "| layer | GEMM | operand | SNR dB (min) | saturated | flushed to 0 |",
           "|---|---|---|---|---|---|"]
  tensor = {(g, s): t for g, s, t, _ in PLACES}
  for (path, gemm, side), v in sorted(result["places"].items()):
    snr = np.asarray(v["snr_db"])
    lines.append(f"| {path} | {gemm} | {tensor[(gemm, side)]} | {snr.mean():.1f} ({snr.min():.1f}) "
                 f"| {np.mean(v['frac_saturated']):.2e} | {np.mean(v['frac_flushed']):.2e} |")
  return "\n".join(lines)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workdir", required=True, help="a train.py workdir with a checkpoint")
  p.add_argument("--recipe", default=None, help="measure with this recipe (default: the run's)")
  p.add_argument("--batches", type=int, default=1)
  p.add_argument("--json", default=None, help="also write the per-block values here")
  args = p.parse_args(argv)
  result = measure(args.workdir, recipe=args.recipe, batches=args.batches)
  print(table(result))
  if args.json:
    with open(args.json, "w") as f:
      json.dump({**result, "places": {"/".join(k): v for k, v in result["places"].items()}}, f)
  return 0


if __name__ == "__main__":
  sys.exit(main())
