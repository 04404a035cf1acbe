"""The per-site monitor's case table (issue 57), part 3 of 3: item 4 (the measured gradients are
the plain jitted run's bits, for a plain function, a linen scan, an NNX scan and a linen MLP) and
item 9 (the loss_delta baseline of a quantize_model model is its policy's). test_monitor_cases.py
has items 1, 2 and 8; monitor_case_models.py what the parts share.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

from bad_input_cases import Case, Holds, check
from monitor_case_models import C, D, MLP_P, QK, RECIPE, X, linen_loss, mlp

from lpjax import quant


# --- item 4: the measured gradients are the plain run's bits ------------------------------------


class _Block(nn.Module):
  @nn.compact
  def __call__(self, h, _):
    return jnp.tanh(nn.Dense(D)(h)), None


class _LinenScan(nn.Module):
  @nn.compact
  def __call__(self, x):
    stack = nn.scan(_Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=2)
    return stack(name="layers")(x, None)[0]


class _LinenMLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(D, name="down")(jnp.tanh(nn.Dense(D, name="up")(x)))


class _NNXScan(nnx.Module):
  """Two stacked layers (kernel and bias) run by lax.scan."""

  def __init__(self, rngs):
    self.kernel = nnx.Param(jax.random.normal(rngs.params(), (2, D, D)) / 6)
    self.bias = nnx.Param(jnp.full((2, D), 0.1))

  def __call__(self, x):
    body = lambda h, wb: (jnp.tanh(h @ wb[0] + wb[1]), None)
    return jax.lax.scan(body, x, (self.kernel.value, self.bias.value))[0]


def _bits(kind):
  if kind == "plain":
    loss, params = mlp, MLP_P
  elif kind in ("linen_scan", "linen"):
    module = _LinenScan() if kind == "linen_scan" else _LinenMLP()
    loss, params = linen_loss(module), module.init(jax.random.key(6), X)
  else:
    graphdef, params = nnx.split(_NNXScan(nnx.Rngs(7)))
    loss = lambda s, b: jnp.mean((nnx.merge(graphdef, s)(b[0]) - b[1]) ** 2)
  target = quant.quantized(loss, RECIPE)
  t = quant.site_stats(target, params, (X, C), quant_key=QK)
  plain = jax.jit(jax.value_and_grad(lambda p, b: target(p, b, quant_key=QK)))(params, (X, C))
  same = lambda a, b: np.asarray(a).tobytes() == np.asarray(b).tobytes()
  leaves = zip(jax.tree.leaves(plain[1]), jax.tree.leaves(t.grads))
  return len(t.rows) > 0 and same(plain[0], t.loss) and all(same(a, b) for a, b in leaves)


# --- item 9: the loss_delta baseline of a quantize_model model is its policy's ------------------


def _quantize_model_baseline():
  module = _LinenMLP()
  params = module.init(jax.random.key(8), X)
  qm = quant.quantize_model(module, quant.QuantPolicy(recipe=RECIPE, high_precision="fp32"))
  loss = lambda p, b, quant_key=None: jnp.mean(
      (qm.apply(p, b[0], rngs={"quant": quant_key}) - b[1]) ** 2)
  t = quant.site_stats(loss, params, (X, C), quant_key=QK, loss_delta=True)
  fp32 = float(jnp.mean((module.apply(params, X) - C) ** 2))  # the model as written
  bf16 = float(jnp.mean((quant.quantize_model(module, "bf16").apply(params, X) - C) ** 2))
  assert abs(bf16 - fp32) > 1e-5 * abs(fp32), (bf16, fp32)  # the two baselines differ
  assert abs(t.hp_loss - fp32) <= 1e-6 * abs(fp32), (t.hp_loss, fp32, bf16)
  return True


CASES = [
    # item 4
    *[Case("4 bits", f"grads of {kind}", lambda _, kind=kind: _bits(kind),
           Holds("loss and grads bit-identical to the plain jitted run"))
      for kind in ("plain", "linen_scan", "nnx_scan", "linen")],
    # item 9
    Case("9 baseline", "quantize_model with high_precision fp32",
         lambda _: _quantize_model_baseline(),
         Holds("hp_loss is the fp32 model's loss")),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.group}-{c.name}")
def test_monitor_case(case, tmp_path):
  check(case, lambda: case.run(tmp_path))
