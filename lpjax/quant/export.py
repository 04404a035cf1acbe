"""export_weights: the packed weights a policy's forward GEMMs multiply, per weight, for serving.

For every 2-D `kernel` (K, N) of a model's params (a dense layer's weight, contracted on its first
axis, as `dot_general` takes it), the forward GEMM quantizes W^T (N, K) along K with the
recipe's W operand quantizer (`recipe.fwd.rhs`, lpjax.quant.gemm.dot_general). `export_weights`
runs that same quantizer (`lpjax.quant.gemm.operand.pack`) and returns its QArray pieces, so the
exported codes decode to exactly the values the training run's forward pass used: NVFP4's 16x16
weight tiles and per-tensor amax included. A kernel with a leading layer axis (L, K, N) (a scanned
stack of blocks) gives one entry per block, "layers/attn/q_proj/kernel" -> "layers/0/attn/...".

Weights the policy keeps in high precision, and parameters that are not GEMM weights (embeddings,
norms, biases, convolution kernels), are not in the result: they are exported as they are.
Quantizers that serving cannot reproduce from the packed values alone are refused with the reason:
a forward Hadamard transform (the `mxfp4` preset's random one, whose signs come from each step's
key, or quartet's fixed one: either way the forward multiplied W in a rotated basis that a served
linear layer does not undo), stochastic rounding, an SR pre-scale, a paper's scheme (QuEST, 4/6,
MS-EDEN) or an SSP grid. With `requantize=True` such a weight is exported instead as the
round-to-nearest-even of the trained W in the same format (OCP MX rules for MXFP4: e8m0 scale
2^(floor(log2 amax) - 2); NVFP4's two-level scales), with a `UserWarning`, and its PackedWeight's
`requantized` says why: the packed values are then NOT those the training forward multiplied
(a model trained through such a recipe is usually robust to this, but it was never trained
against these exact values). SSP grids have no packed layout and stay refused.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax.quant.policy import QuantPolicy
  >>> from lpjax.quant.codec.qarray import fake_quant
  >>> params = {"mlp": {"up": {"kernel": jax.random.normal(jax.random.key(0), (64, 32))}},
  ...           "norm": {"scale": jnp.ones(64)}}
  >>> packed = export_weights(params, QuantPolicy(recipe="nvfp4", keep_high_precision=()))
  >>> w = packed["mlp/up/kernel"]
  >>> w.format.name, w.codes.shape, w.scales.shape, w.tensor_scale.shape  # W^T, 16x16 tiles
  ('nvfp4_16x16', (32, 32), (2, 4), ())
  >>> bool((w.dequantize() == fake_quant(params["mlp"]["up"]["kernel"].T, "nvfp4_16x16")).all())
  True
  >>> import warnings
  >>> with warnings.catch_warnings(record=True) as caught:   # mxfp4: RHT-32 in the forward
  ...   warnings.simplefilter("always")
  ...   rtn = export_weights(params, QuantPolicy(recipe="mxfp4", keep_high_precision=()),
  ...                        requantize=True)["mlp/up/kernel"]
  >>> rtn.requantized[:37], len(caught)
  ("mxfp4's forward GEMM rotates W with a", 1)
  >>> bool((rtn.dequantize() == fake_quant(params["mlp"]["up"]["kernel"].T, "mxfp4")).all())
  True
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.quant.codec.qarray import QArray, dequantize
from lpjax.quant.formats.specs import QuantFormat
from lpjax.quant.gemm import operand as opq
from lpjax.quant.policy import QuantPolicy, param_path
from lpjax.quant.recipes.gemm_recipe import REUSE_FWD, OperandQuant

_DETERMINISTIC = ("nearest_even", "nearest_away")


@dataclasses.dataclass(frozen=True)
class PackedWeight:
  """One weight as its forward GEMM quantizes it: W^T (out, in), blocked along `in` (axis -1)."""

  codes: np.ndarray  # uint8 (out, ceil(in / 2)) for 4-bit formats (element 2i the low nibble)
  scales: np.ndarray  # uint8 e8m0 / ue4m3 bytes (or float32), one per block (NVFP4 16x16: per tile)
  tensor_scale: np.ndarray | None  # float32 amax_t of NVFP4 (decode multiplier amax_t / 2688)
  format: QuantFormat  # the format of the codes and scales
  shape: tuple[int, int]  # (out, in) of the dequantized weight: the kernel's (K, N) transposed
  recipe: str  # the name of the recipe whose W quantizer this is
  requantized: str = ""  # "": the forward's exact values; else why they are W's plain RTN instead

  def qarray(self) -> QArray:
    """The lpjax QArray of these pieces (float32 values)."""
    ts = None if self.tensor_scale is None else jnp.asarray(self.tensor_scale)
    return QArray(jnp.asarray(self.codes), jnp.asarray(self.scales), ts, None, self.format,
                  tuple(self.shape), 1, jnp.float32)

  def dequantize(self) -> jax.Array:
    """The float32 values W^T (out, in) that the forward GEMM multiplied."""
    return dequantize(self.qarray(), jnp.float32)


def _weight_operand(recipe, path: str, requantize: bool = False):
  """(the W quantizer to pack with, "" or why it is not the forward's own), or (None, "") when
  the weight stays in high precision; raises when packed values alone cannot reproduce the
  forward's and `requantize` is off (or the quantizer has no packed layout)."""
  if recipe.fwd is None:
    return None, ""
  op = recipe.fwd.rhs
  if op is None or op == REUSE_FWD:
    return None, ""
  why = None
  if recipe.trust_masked and (recipe.fwd.hadamard_block or op.hadamard_block):
    why = ("rotates W with a fixed Hadamard transform before its QuEST quantizer, so the values "
           "it multiplied live in a rotated basis that a served linear layer does not undo")
  elif recipe.fwd.hadamard_block or op.hadamard_block:
    why = ("rotates W with a random Hadamard transform (its signs come from each step's key), "
           "which a served linear layer does not apply")
  elif op.is_ssp:
    why = "uses an SSP grid, which has no packed layout here"
  elif op.scheme:
    why = f"uses the {op.scheme!r} scheme, whose values are not one format's codes and scales"
  elif op.sr_prescale is not None:
    why = "pre-scales W before rounding"
  elif op.rounding not in _DETERMINISTIC:
    why = f"rounds W with {op.rounding!r} rounding, which differs from step to step"
  if not why:
    return op, ""
  name = getattr(recipe, "name", None) or "this recipe"
  if requantize and not op.is_ssp:
    return OperandQuant(op.fmt), f"{name}'s forward GEMM {why}"
  hint = ("" if op.is_ssp else " To export the round-to-nearest of the trained weights in the same "
          "format instead (not the values the training forward multiplied), pass "
          "requantize=True (python -m lpjax.export --allow_requantize).")
  raise ValueError(
      f"Cannot export {path}: {name}'s forward GEMM {why}. Export with a recipe whose forward "
      "weight quantizer is plain round-to-nearest without RHT (e.g. mxfp4_naive, nvfp4), "
      f"or export bf16.{hint}")


def _pack(w_t, op, recipe, requantized: str) -> PackedWeight:
  q = opq.pack(w_t, op, axis=-1, key=None)
  ts = None if q.tensor_scale is None else np.asarray(q.tensor_scale, np.float32)
  return PackedWeight(np.asarray(q.codes), np.asarray(q.scales), ts, op.format,
                      tuple(int(d) for d in w_t.shape), getattr(recipe, "name", "") or "",
                      requantized)


def export_weights(params, policy: QuantPolicy, *, dtype=None,
                   requantize: bool = False) -> dict[str, PackedWeight]:
  """{weight path: PackedWeight} for every 2-D kernel that `policy` quantizes in the forward pass.

  Args:
    params: a model's parameters (any pytree; a kernel's path names its layer, as the policy
      sees it, plus "kernel", named by `lpjax.quant.policy.param_path`: a linen variables dict's
      "params" collection is left out); kernels of shape (L, K, N) are a scanned stack of L blocks.
    policy: the policy the model runs, completed by the model (`QuantPolicy.for_model`) when it
      keeps blocks; each layer's `recipe_for(path, block=...)` decides its W quantizer.
    dtype: the dtype the layer feeds the GEMM (a model's compute dtype, e.g. "bfloat16"); None:
      the kernel's own dtype.
    requantize: for a W quantizer that packed values cannot reproduce (a forward Hadamard
      transform, stochastic rounding, a paper's scheme), pack the round-to-nearest-even of W in
      its format instead of refusing, with a UserWarning; each such PackedWeight's
      `requantized` says why its values are not the training forward's.

  Returns:
    A dict from "/"-joined paths (blocks of a stack numbered, "layers/3/mlp/up_proj/kernel")
    to PackedWeight; high-precision weights are left out.
  """
  out = {}
  def add(name, w_t, recipe):
    op, requantized = _weight_operand(recipe, name, requantize)
    if op is not None:
      out[name] = _pack(w_t, op, recipe, requantized)

  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = param_path(path)  # the policy's naming (no nnx.State value, no linen "params")
    if not name.endswith("kernel") or np.ndim(leaf) not in (2, 3):
      continue
    layer = name[:-len("kernel")].rstrip("/")
    w = jnp.asarray(leaf) if dtype is None else jnp.asarray(leaf).astype(dtype)
    if w.ndim == 2:
      add(name, w.T, policy.recipe_for(layer))
      continue
    head, _, tail = name.partition("/")
    for i in range(w.shape[0]):
      add(f"{head}/{i}/{tail}", w[i].T, policy.recipe_for(layer, block=i))
  reasons = sorted({p.requantized for p in out.values() if p.requantized})
  if reasons:
    n = sum(bool(p.requantized) for p in out.values())
    warnings.warn(f"export_weights: {n} weight(s) requantized: {'; '.join(reasons)}. Their packed "
                  "values are the round-to-nearest of the trained weights in the same format, NOT "
                  "the values the training forward multiplied.", UserWarning, stacklevel=2)
  return out
