"""lpjax.models.resnet: shapes, parameter counts, the quantization policy, BatchNorm state and
numerics, a quantized conv's gradients against an explicit computation, and training on digits."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from lpjax.models import resnet
from lpjax.quant import QuantPolicy, fake_quant, path_str

TINY = resnet.ResNetConfig(name="resnet_tiny", num_classes=10, in_channels=1, stem="small")


def _count(tree):
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


@pytest.fixture(scope="module")
def tiny():
  graphdef, _, _ = resnet.abstract_model(TINY)
  # An RBG key: its initializer compiles ~4x faster on CPU than threefry's.
  params, stats = jax.jit(lambda k: resnet.init_variables(TINY, k))(jax.random.key(0, impl="rbg"))
  return graphdef, params, stats


def test_parameter_counts_match_the_reference_architectures():
  # torchvision's resnet50 / resnet18 (1000 classes): 25,557,032 and 11,689,512 parameters.
  _, params, stats = resnet.abstract_model(resnet.ResNetConfig(name="resnet50"))
  assert _count(params) == 25_557_032
  assert _count(stats) == 2 * 26_560  # a running mean and variance per BN channel
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params))  # no allocation
  assert _count(resnet.abstract_model(resnet.ResNetConfig(name="resnet18"))[1]) == 11_689_512


@pytest.mark.parametrize("name,stem,size", [("resnet50", "small", 32), ("resnet18", "imagenet", 64),
                                            ("resnet18", "small", 16)])
def test_large_variants_output_shapes(name, stem, size):
  cfg = resnet.ResNetConfig(name=name, num_classes=100, stem=stem)
  graphdef, params, stats = resnet.abstract_model(cfg, QuantPolicy.from_settings("mxfp4"))
  images = jax.ShapeDtypeStruct((2, size, size, 3), jnp.float32)
  logits, new_stats = jax.eval_shape(
      lambda p, s, x: resnet.apply(graphdef, cfg, p, s, x, None, jax.random.key(0), train=True),
      params, stats, images)
  assert logits.shape == (2, 100) and logits.dtype == jnp.float32
  assert jax.tree.map(lambda a: (a.shape, a.dtype), new_stats) == jax.tree.map(
      lambda a: (a.shape, a.dtype), stats)


def test_tiny_runs_and_policy_keeps_stem_and_head_high_precision(tiny):
  graphdef, params, stats = tiny
  x = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (3, 8, 8, 1)), jnp.float32)
  logits, _ = jax.jit(lambda p, s, x: resnet.apply(graphdef, TINY, p, s, x, None, None, train=False))(
      params, stats, x)
  assert logits.shape == (3, 10) and bool(jnp.isfinite(logits).all())

  cfg = resnet.ResNetConfig(name="resnet_tiny", stem="small")
  policy = QuantPolicy.from_settings("mxfp4", high_precision="bf16")  # as the trainer builds it
  model = nnx.eval_shape(lambda: resnet.ResNet(cfg, policy, rngs=nnx.Rngs(params=0)))
  layers = {path: m for path, m in ((path_str(p), m) for p, m in nnx.iter_modules(model))
            if hasattr(m, "active_recipe")}
  assert len(layers) == 1 + 6 + 2 + 1  # stem, 3 blocks x 2 convs, 2 shortcuts, head
  active = {path: m.active_recipe().name for path, m in layers.items()}
  assert active.pop("stem") == "bf16" and active.pop("head") == "bf16"
  assert set(active.values()) == {"mxfp4"}
  model.set_policy(policy.with_recipe("fp8"))  # a schedule's switch leaves the kept layers alone
  assert layers["stem"].active_recipe().name == "bf16"
  assert layers["blocks/1/conv1"].active_recipe().name == "fp8"
  pure = dict(resnet.policy_table(resnet.ResNetConfig(name="resnet_tiny"),
                                  QuantPolicy.from_settings("mxfp4", pure=True)))
  assert set(pure.values()) == {"mxfp4"} and "stem" in pure and "head" in pure


def test_batch_stats_update_in_train_mode_only(tiny):
  _, params, stats = tiny
  cfg = TINY
  policy = QuantPolicy.from_settings("fp32", high_precision="fp32")  # exact convs
  graphdef = resnet.abstract_model(cfg, policy)[0]  # the graphdef carries the policy
  x = jnp.asarray(np.random.default_rng(1).normal(0.3, 1.0, (8, 8, 8, 1)), jnp.float32)
  run = jax.jit(lambda s, x, train: resnet.apply(graphdef, cfg, params, s, x, None, None,
                                                 train=train), static_argnums=2)
  _, after_train = run(stats, x, True)
  # The stem BN's running averages: momentum 0.9 toward the batch statistics of the stem conv.
  kernel = np.asarray(params["stem"]["kernel"][...], np.float64)
  conv = jax.lax.conv_general_dilated(np.asarray(x, np.float64), kernel, (1, 1), ((1, 1), (1, 1)),
                                      dimension_numbers=("NHWC", "HWIO", "NHWC"))
  conv = np.asarray(conv)
  np.testing.assert_allclose(after_train["stem_bn"]["mean"][...], 0.1 * conv.mean((0, 1, 2)),
                             rtol=1e-4, atol=1e-5 * np.abs(conv).max())
  np.testing.assert_allclose(after_train["stem_bn"]["var"][...], 0.9 + 0.1 * conv.var((0, 1, 2)),
                             rtol=1e-4)
  logits, after_eval = run(after_train, x, False)
  for a, b in zip(jax.tree.leaves(after_eval), jax.tree.leaves(after_train)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Eval logits of a row do not depend on the rest of the batch; train logits do.
  other = x.at[1:].set(-x[1:])
  np.testing.assert_allclose(run(after_train, other, False)[0][0], logits[0], rtol=1e-5, atol=1e-5)
  train_a, train_b = run(after_train, x, True)[0][0], run(after_train, other, True)[0][0]
  assert float(jnp.abs(train_a - train_b).max()) > 1e-3


def test_batchnorm_statistics_and_normalization_are_float32():
  # Values near 256 with unit spread: bf16 spacing there is 2, so bf16 statistics would be useless.
  rng = np.random.default_rng(2)
  x = jnp.asarray(256 + rng.integers(-8, 9, (64, 3, 3, 4)).astype(np.float32), jnp.bfloat16)
  bn = resnet.BatchNorm(4, momentum=0.0, epsilon=1e-5, dtype=jnp.float32, use_fast_variance=False,
                        rngs=nnx.Rngs(0))
  y = bn(x, use_running_average=False)
  assert y.dtype == jnp.bfloat16 and bn.mean[...].dtype == jnp.float32
  x64 = np.asarray(x, np.float64)
  mean, var = x64.mean((0, 1, 2)), x64.var((0, 1, 2))
  # A mean held in bf16 would be off by up to 2^-9 relative (~0.5 here), a float32 one by ~1e-7.
  np.testing.assert_allclose(bn.mean[...], mean, rtol=1e-6)
  np.testing.assert_allclose(bn.var[...], var, rtol=1e-5)
  want = (x64 - mean) / np.sqrt(var + 1e-5)
  np.testing.assert_allclose(np.asarray(y, np.float64), want, atol=2 ** -7 * np.abs(want).max())
  # In a bf16 model the running averages stay float32.
  cfg = resnet.ResNetConfig(name="resnet_tiny", num_classes=10, in_channels=1, stem="small",
                            compute_dtype="bfloat16")
  _, _, stats = resnet.abstract_model(cfg)
  assert {a.dtype for a in jax.tree.leaves(stats)} == {jnp.dtype(jnp.float32)}


def _im2col_3x3(x):
  """(N*H*W, 9*C) patches of a stride-1, pad-1 3x3 conv, taps row-major, channels minor."""
  n, h, w, c = x.shape
  xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
  cols = [xp[:, i:i + h, j:j + w] for i in range(3) for j in range(3)]
  return np.stack(cols, axis=3).reshape(n * h * w, 9 * c)


def test_quantized_conv_gradients_match_an_explicit_computation(tiny):
  """Model's blocks/1/conv2 (32 -> 32 channels) under mxfp4_naive: forward, dgrad and wgrad."""
  graphdef, params, stats = tiny
  cfg = resnet.ResNetConfig(name="resnet_tiny", num_classes=10, in_channels=1, stem="small")
  policy = QuantPolicy.from_settings("mxfp4_naive")
  model = nnx.merge(resnet.abstract_model(cfg, policy)[0], params, stats)
  conv = model.blocks[1].conv2
  assert conv.active_recipe().name == "mxfp4_naive"
  conv_def, conv_params = nnx.split(conv, nnx.Param)
  rng = np.random.default_rng(3)
  x = rng.normal(size=(2, 4, 4, 32)).astype(np.float32)
  dy = (rng.normal(size=(2, 4, 4, 32)) * 1e-2).astype(np.float32)
  key = jax.random.key(7)

  @jax.jit
  def model_vjp(x, p, dy):
    y, vjp = jax.vjp(lambda x, p: nnx.merge(conv_def, p)(x, key=key), x, p)
    dx, dp = vjp(dy)
    return y, dx, dp["kernel"][...]

  y, dx, dw = model_vjp(x, conv_params, dy)
  w = np.asarray(conv_params["kernel"][...])
  patches = _im2col_3x3(x)
  hi = jax.lax.Precision.HIGHEST
  lax_conv = lambda a, k: jax.lax.conv_general_dilated(
      a, k, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=hi)
  q = lambda a, axis: fake_quant(a, "mxfp4", axis=axis)

  @jax.jit
  def reference(x, w, dy, patches):
    y = lax_conv(q(x, -1), q(w, 2))  # fwd: a block = one tap's 32 input channels
    _, x_vjp = jax.vjp(lambda a: lax_conv(a, q(w, 3)), x)  # dgrad: W and dY along outputs,
    (dx,) = x_vjp(q(dy, -1))  # then the conv's transpose
    # wgrad: patches and dY quantized along the tokens (N*H*W = 32: one block).
    dw = jnp.matmul(q(patches, 0).T, q(dy.reshape(-1, 32), 0), precision=hi).reshape(w.shape)
    return y, dx, dw, lax_conv(x, w)

  y_ref, dx_ref, dw_ref, y_fp = reference(x, w, dy, patches)
  for got, want, name in ((y, y_ref, "fwd"), (dx, dx_ref, "dgrad"), (dw, dw_ref, "wgrad")):
    want = np.asarray(want)
    scale = np.abs(want).max()
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5 * scale, err_msg=name)
  # Quantization changed the results far beyond that tolerance.
  y_fp = np.asarray(y_fp)
  assert np.abs(np.asarray(y) - y_fp).max() > 1e-2 * np.abs(y_fp).max()
  dw_fp = (patches.T @ dy.reshape(-1, 32)).reshape(w.shape)
  assert np.abs(np.asarray(dw) - dw_fp).max() > 1e-2 * np.abs(dw_fp).max()


def test_training_on_digits_reduces_the_loss(tiny):
  from lpjax.data import digits_dataset

  _, params, stats = tiny
  cfg = TINY
  graphdef = resnet.abstract_model(cfg, QuantPolicy.from_settings("bf16"))[0]
  tx = optax.adam(1e-2)
  opt_state = tx.init(params)

  def loss_fn(p, s, batch, key):
    logits, s = resnet.apply(graphdef, cfg, p, s, batch["image"], None, key, train=True)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
    return loss, s

  @jax.jit
  def step(p, s, o, batch, key):
    (loss, s), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, s, batch, key)
    updates, o = tx.update(grads, o, p)
    return optax.apply_updates(p, updates), s, o, loss

  data = digits_dataset()
  held_out = data.eval_batch(0, 128)
  first, _ = jax.jit(loss_fn)(params, stats, held_out, jax.random.key(1))
  for i in range(12):
    params, stats, opt_state, _ = step(params, stats, opt_state, data.train_batch(i, 64, seed=0),
                                       jax.random.key(i))
  last, _ = jax.jit(loss_fn)(params, stats, held_out, jax.random.key(1))
  assert float(first) > 2.0 and float(last) < 0.7 * float(first), (float(first), float(last))


def test_partition_rules_cover_every_variable_and_replicate():
  from lpjax.train.step import _sharding as sharding

  _, params, stats = resnet.abstract_model(resnet.ResNetConfig(name="resnet50"))
  mesh = sharding.make_mesh(2, 4, 1)
  for tree in (params, stats):
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
      p = sharding.path_string(path)
      assert any(re.search(pattern, p) and len(axes) == len(leaf.shape)
                 for pattern, axes in resnet.PARTITION_RULES), p
    specs = sharding.tree_shardings(tree, mesh, resnet.PARTITION_RULES)
    assert all(all(a is None for a in s.spec) for s in jax.tree.leaves(specs))


def test_config_errors():
  with pytest.raises(ValueError, match="valid: resnet18, resnet50, resnet_tiny"):
    resnet.ResNetConfig(name="resnet101")
  with pytest.raises(ValueError, match="valid: imagenet, small"):
    resnet.ResNetConfig(stem="cifar")
