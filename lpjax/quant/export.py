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


# leading path components a framework adds before the model's own names: linen's variable
# collection ("params/..."), a wrapper's attribute ("model/..."). The policy's rules name the
# model's layers, so they are matched without these (a local normalisation: interception's site
# paths are named by lpjax/quant/intercept/sites.py).
_PREFIXES = ("params", "model")
# parameter names that are no GEMM's weight, whatever their shape (a stack's norm scales are 2-D)
_NOT_GEMM = ("embedding", "embeddings", "scale", "bias")
# a path component that holds a stack of scanned blocks (DEFAULT_BLOCK_PATTERN's names)
_STACKS = ("layers", "blocks", "block", "layer", "h")


def _split_prefix(parts: list[str]) -> tuple[list[str], list[str]]:
  n = 0
  while n < len(parts) - 1 and parts[n] in _PREFIXES:
    n += 1
  return parts[:n], parts[n:]


def _stack_axis(parts: list[str], leading: int, num_blocks: int | None) -> int | None:
  """Where a scanned stack's block index goes in `parts` (after its container: "layers"), or
  None when this 3-D kernel is no stack of blocks (a DenseGeneral's (in, heads, dim), a
  convolution's (width, in, out))."""
  for i, part in enumerate(parts[:-1]):
    if part in _STACKS:
      if any(p.isdigit() for p in parts[i + 1:]):  # blocks already numbered: unrolled
        return None
      if num_blocks is not None and leading != num_blocks:
        return None
      return i + 1
  return None


def _weights(params, policy: QuantPolicy, stacked=None):
  """Yields (name, W^T (out, in), recipe) of every GEMM weight of `params`, and collects what it
  leaves out: returns the list of (path, shape, why) through StopIteration's value."""
  flags = None if stacked is None else jax.tree.leaves(stacked)
  skipped = []
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  for n, (path, leaf) in enumerate(leaves):
    name = param_path(path)  # the policy's naming: no nnx.State value, no linen "params"
    parts = name.split("/")
    prefix, own = _split_prefix(parts)
    ndim, shape = np.ndim(leaf), tuple(np.shape(leaf))
    if parts[-1] != "kernel":
      if ndim >= 2 and parts[-1] not in _NOT_GEMM:
        skipped.append((name, shape, "not named kernel: not taken for a dense layer's weight"))
      continue
    layer = "/".join(own[:-1])
    if ndim == 2:
      yield name, leaf, None, layer
      continue
    if ndim == 3:
      if flags is not None:
        axis = None
        if flags[n]:
          axis = next((i + 1 for i, p in enumerate(own[:-1]) if p in _STACKS), 1)
      else:
        axis = _stack_axis(own, shape[0], policy.num_blocks)
      if axis is not None:
        for i in range(shape[0]):
          block_own = own[:axis] + [str(i)] + own[axis:]
          yield "/".join(prefix + block_own), leaf, i, "/".join(own[:-1])
        continue
    skipped.append((name, shape, f"a {ndim}-D kernel that is no scanned stack of blocks (a "
                    "DenseGeneral's or a convolution's): not packed"))
  return skipped


def weight_recipes(params, policy: QuantPolicy, *, stacked=None) -> dict:
  """{weight path: the recipe its forward GEMM runs} of the weights `export_weights` would pack
  or refuse (the ones the forward quantizes; blocks of a stack numbered), without packing or
  checking anything: what a caller checks first, e.g. that their formats fit a file layout."""
  out = {}
  gen = _weights(params, policy, stacked)
  try:
    while True:
      name, _, block, layer = next(gen)
      recipe = policy.recipe_for(layer, block=block)
      op = recipe.fwd.rhs if recipe.fwd is not None else None
      if op is not None and op != REUSE_FWD:
        out[name] = recipe
  except StopIteration:
    pass
  return out


def export_weights(params, policy: QuantPolicy, *, dtype=None, requantize: bool = False,
                   stacked=None) -> dict[str, PackedWeight]:
  """{weight path: PackedWeight} for every 2-D kernel that `policy` quantizes in the forward pass.

  Args:
    params: a model's parameters (any pytree: nnx.State, linen variables; a kernel's path names
      its layer, as the policy sees it, plus "kernel", named by `lpjax.quant.policy.param_path`:
      a linen variables dict's "params" collection is left out; a leading "model/" component is
      not part of the names the policy's rules match).
    policy: the policy the model runs, completed by the model (`QuantPolicy.for_model`) when it
      keeps blocks; each layer's `recipe_for(path, block=...)` decides its W quantizer.
    dtype: the dtype the layer feeds the GEMM (a model's compute dtype, e.g. "bfloat16"); None:
      the kernel's own dtype.
    requantize: for a W quantizer that packed values cannot reproduce (a forward Hadamard
      transform, stochastic rounding, a paper's scheme), pack the round-to-nearest-even of W in
      its format instead of refusing, with a UserWarning; each such PackedWeight's
      `requantized` says why its values are not the training forward's.
    stacked: a pytree of bools like `params` (a model's `stacked_layers`): True for a kernel of
      shape (L, K, N) stacking L scanned blocks. None: a 3-D kernel is a stack when its path
      holds a stack container ("layers", "blocks", "h", ...) without a block number, and its
      leading axis is the policy's num_blocks (when known).

  Returns:
    A dict from "/"-joined paths (blocks of a stack numbered after their container,
    "layers/3/mlp/up_proj/kernel", "model/layers/3/up/kernel") to PackedWeight; high-precision
    weights are left out. Arrays of 2 or more dimensions it does not pack (3-D kernels that are
    no stack, weights not named "kernel"; embeddings aside) are listed in one UserWarning.
  """
  out, last = {}, (None, None)
  gen = _weights(params, policy, stacked)
  while True:
    try:
      name, leaf, block, layer = next(gen)
    except StopIteration as stop:
      skipped = stop.value
      break
    if last[0] is not leaf:  # a stack's blocks: converted once
      last = (leaf, jnp.asarray(leaf) if dtype is None else jnp.asarray(leaf).astype(dtype))
    w = last[1]
    if block is not None:
      w = w[block]
    recipe = policy.recipe_for(layer, block=block)
    op, requantized = _weight_operand(recipe, name, requantize)
    if op is not None:
      out[name] = _pack(w.T, op, recipe, requantized)
  if skipped:
    listing = "; ".join(f"{name} {shape}: {why}" for name, shape, why in skipped)
    warnings.warn(f"export_weights left {len(skipped)} array(s) as they are: {listing}. Pass "
                  "stacked= for a stack of scanned blocks; export the others unquantized.",
                  UserWarning, stacklevel=2)
  reasons = sorted({p.requantized for p in out.values() if p.requantized})
  if reasons:
    n = sum(bool(p.requantized) for p in out.values())
    warnings.warn(f"export_weights: {n} weight(s) requantized: {'; '.join(reasons)}. Their packed "
                  "values are the round-to-nearest of the trained weights in the same format, NOT "
                  "the values the training forward multiplied.", UserWarning, stacklevel=2)
  return out
