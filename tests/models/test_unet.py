"""lpjax.models.unet: shapes, the DDPM CIFAR-10 parameter count, the quantization policy, sharding
rules, config checks, and a few quantized training steps that lower the diffusion loss."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from lpjax.models import diffusion, unet
from lpjax.models.unet import abstract_model, apply, init_params, num_params, unet_cifar10, unet_tiny
from lpjax.quant import QuantPolicy
from lpjax.train.step import _sharding as sharding

TINY = unet_tiny(image_size=8, channels=1)
KEY = jax.random.key(0)


def abstract_unet(cfg, policy=None):
  """The U-Net of `cfg` built with `policy`, with abstract parameters (nothing allocated)."""
  graphdef, params = abstract_model(cfg, policy)
  return nnx.merge(graphdef, params)


def layers_of(model):
  """{path: layer} of the QDense / QConv / QEinsum layers of a model."""
  return {m.path: m for _, m in nnx.iter_modules(model) if hasattr(m, "active_recipe")}


def quantized_layers(cfg, policy=None):
  """{path: layer} of the quantized layers of an abstract model (nothing allocated)."""
  return layers_of(abstract_unet(cfg, policy))


def with_random_zero_layers(params):
  """conv_out and the layers closing residual branches start at zero (DDPM), so at init eps == 0
  and no branch (hence no time embedding) reaches the output; give them random weights."""
  def fill(path, x):
    if np.any(np.asarray(x)):
      return x
    return 0.1 * jax.random.normal(jax.random.fold_in(jax.random.key(9), len(str(path))), x.shape)
  return jax.tree_util.tree_map_with_path(fill, params)


@pytest.mark.parametrize("cfg", [TINY, unet_tiny(image_size=16, channels=3, attention_resolutions=(8,))],
                         ids=["8x8x1", "16x16x3_attn8"])
def test_output_has_the_input_shape_and_depends_on_x_t_and_only_its_own_example(cfg):
  graphdef, _ = abstract_model(cfg)
  params = init_params(cfg, KEY)
  f = jax.jit(lambda p, x, t: apply(graphdef, cfg, p, x, t, None, jax.random.key(1)))
  s, c = cfg.image_size, cfg.channels
  x = jax.random.normal(jax.random.key(2), (2, s, s, c))
  t = jnp.array([10, 700])
  eps0 = f(params, x, t)
  assert eps0.shape == x.shape and eps0.dtype == jnp.float32
  assert float(jnp.abs(eps0).max()) == 0.0  # zero-initialised output conv
  params = with_random_zero_layers(params)
  eps = f(params, x, t)
  assert bool(jnp.all(jnp.isfinite(eps))) and float(jnp.abs(eps).max()) > 0
  other_t = f(params, x, jnp.array([10, 100]))
  np.testing.assert_array_equal(other_t[0], eps[0])  # no mixing across the batch
  assert float(jnp.abs(other_t[1] - eps[1]).max()) > 1e-4  # the time embedding reaches the output
  other_x = f(params, x.at[1].multiply(-1.0), t)
  np.testing.assert_array_equal(other_x[0], eps[0])
  assert float(jnp.abs(other_x[1] - eps[1]).max()) > 1e-4


def test_cifar10_preset_is_the_ddpm_model_with_35_7m_parameters():
  cfg = unet_cifar10()
  assert (cfg.base_width, cfg.channel_mults, cfg.num_res_blocks, cfg.attention_resolutions,
          cfg.dropout) == (128, (1, 2, 2, 2), 2, (16,), 0.1)
  n = num_params(abstract_model(cfg)[1])
  # Ho et al. 2020 (App. B) report 35.7M, i.e. 35.65M-35.75M; the official model (and independent
  # ports of it) count exactly 35,746,307.
  assert 35.65e6 <= n < 35.75e6
  assert n == 35_746_307
  paths = quantized_layers(cfg)
  assert "down/1/attn/1/q" in paths and "up/2/attn/2/attn_scores" in paths  # 16x16 levels
  assert not any(p.startswith(("down/0/attn", "down/2/attn", "up/0/attn", "up/3/attn")) for p in paths)


def test_tiny_preset_is_small():
  assert 100_000 <= num_params(abstract_model(TINY)[1]) <= 300_000


KEPT = {"conv_in", "conv_out", "time_embed/dense0", "time_embed/dense1", "mid_attn/attn_scores",
        "mid_attn/attn_values"}


def test_policy_keeps_first_last_time_embedding_and_attention_products_high_precision():
  policy = QuantPolicy.from_settings("mxfp4_e4m3scale", high_precision="bf16")  # the trainer's
  model = abstract_unet(unet_tiny(), policy)
  layers = layers_of(model)
  recipes = {p: m.active_recipe().name for p, m in layers.items()}
  assert {p for p, r in recipes.items() if r == "bf16"} == KEPT
  rest = {p: r for p, r in recipes.items() if p not in KEPT}
  assert set(rest.values()) == {"mxfp4_e4m3scale"} and len(rest) == 35
  assert {"down/0/res/0/conv1", "down/0/resample", "up/0/res/1/skip", "mid_attn/q",
          "mid_res1/time_proj", "up/0/resample"} <= set(rest)
  # Full-precision validation: every layer runs fp32, the kept ones too (a kept layer never runs
  # below the recipe the run asked for: QuantPolicy's kept_recipe).
  model.set_policy(policy.with_recipe("fp32"))
  over = {p: m.active_recipe().name for p, m in layers.items()}
  assert set(over.values()) == {"fp32"} and set(over) == KEPT | set(rest)
  pure = quantized_layers(unet_tiny(), QuantPolicy.from_settings("mxfp4_e4m3scale", pure=True))
  assert {m.active_recipe().name for m in pure.values()} == {"mxfp4_e4m3scale"}


def test_partition_rules_shard_the_dense_kernels_and_replicate_convs():
  cfg = unet_cifar10()
  _, params = abstract_model(cfg)
  mesh = sharding.make_mesh(data=1, fsdp=8, tensor=1)
  specs = sharding.tree_shardings(params, mesh, unet.PARTITION_RULES)
  flat = {sharding.path_string(p).removesuffix("/value"): s.spec
          for p, s in jax.tree_util.tree_flatten_with_path(specs)[0]}
  assert flat["down/1/attn/0/q/kernel"] == jax.sharding.PartitionSpec("fsdp", None)
  assert flat["time_embed/dense0/kernel"] == jax.sharding.PartitionSpec("fsdp", None)
  assert flat["mid_attn/proj_out/kernel"] == jax.sharding.PartitionSpec(None, "fsdp")
  assert flat["down/0/res/0/conv1/kernel"] == jax.sharding.PartitionSpec(None, None, None, None)
  assert flat["conv_in/kernel"] == jax.sharding.PartitionSpec(None, None, None, None)
  assert flat["mid_res1/norm1/scale"] == jax.sharding.PartitionSpec(None)


def test_bad_configs_and_inputs_raise_clear_errors():
  with pytest.raises(ValueError, match="divisible by 2"):
    unet_tiny(image_size=6, channel_mults=(1, 2, 2))
  with pytest.raises(ValueError, match="attention resolution 5"):
    unet_tiny(attention_resolutions=(5,))
  with pytest.raises(ValueError, match="norm_groups"):
    unet_tiny(norm_groups=5)
  with pytest.raises(ValueError, match="heads"):
    unet_tiny(heads=3)
  with pytest.raises(ValueError, match="dropout"):
    unet_tiny(dropout=1.0)
  graphdef, params = abstract_model(TINY)
  with pytest.raises(ValueError, match=r"x_t must have shape \(batch, 8, 8, 1\)"):
    jax.eval_shape(lambda p: apply(graphdef, TINY, p, jnp.zeros((2, 8, 8, 3)), 0, None, KEY), params)
  with pytest.raises(ValueError, match="needs a key"):
    apply(graphdef, TINY, params, jnp.zeros((2, 8, 8, 1)), 0, None, None)


def test_apply_threads_a_key_to_every_quantized_layer():
  # Strip every layer's own RNG stream: a layer that apply left without a key then raises. Tracing
  # the gradient (no compile) with MXFP4 covers the RHT signs (forward) and SR (backward) of all
  # 41 layers, dropout included.
  cfg = unet_tiny(dropout=0.1)
  graphdef, params = abstract_model(cfg, QuantPolicy.from_settings("mxfp4"))
  model = nnx.merge(graphdef, params)
  layers = [m for _, m in nnx.iter_modules(model) if hasattr(m, "active_recipe")]
  for layer in layers:
    layer.quant_rngs = None
  graphdef, params = nnx.split(model, nnx.Param)
  sched = diffusion.linear_schedule()
  def loss(p):
    eps_fn = lambda x, t: apply(graphdef, cfg, p, x, t, None, KEY, train=True)
    return diffusion.diffusion_loss(eps_fn, sched, jnp.zeros((2, 8, 8, 1)), KEY)
  grads = jax.eval_shape(jax.grad(loss), params)
  assert jax.tree.structure(grads) == jax.tree.structure(params) and len(layers) == 41
  x = jax.ShapeDtypeStruct((2, 32), jnp.float32)
  with pytest.raises(ValueError, match="needs random keys"):  # the control: a call without a key
    jax.eval_shape(lambda p, x: nnx.merge(graphdef, p).mid_attn.q(x), params, x)


def smooth_images(n, size, key):
  """Random low-frequency images in [-1, 1] (a few cosines per image)."""
  k1, k2 = jax.random.split(key)
  freq = jax.random.uniform(k1, (n, 2, 1, 1), minval=0.3, maxval=1.2)
  phase = jax.random.uniform(k2, (n, 2, 1, 1), maxval=2 * np.pi)
  grid = jnp.arange(size, dtype=jnp.float32)
  img = jnp.cos(freq[:, 0] * grid[:, None] + phase[:, 0]) * jnp.cos(freq[:, 1] * grid[None, :] + phase[:, 1])
  return img[..., None]


@pytest.mark.slow
def test_quantized_training_steps_lower_the_loss_also_in_fp32_validation():
  # One level and plain MXFP4 (E8M0 scales, RTN, all three GEMMs) keep the CPU compile short (21
  # quantized layers). The keyed recipes run the same code (see the test above); mxfp4_e4m3scale,
  # the diffusion recipe, compiles ~10x slower on CPU: benchmarks/studies/vision_diffusion.py trains it.
  cfg = unet_tiny(image_size=8, channels=1, channel_mults=(1,), dropout=0.1)
  policy = QuantPolicy.from_settings("mxfp4_naive")
  graphdef, _ = abstract_model(cfg, policy)
  params = init_params(cfg, KEY)
  sched = diffusion.linear_schedule()
  x0 = smooth_images(16, 8, jax.random.key(3))
  tx = optax.adam(2e-3)

  def loss_fn(p, run_policy, key, train):
    eps_fn = lambda x, t: apply(graphdef, cfg, p, x, t, run_policy, key, train=train)
    return diffusion.diffusion_loss(eps_fn, sched, x0, jax.random.key(7))  # fixed t and noise

  @jax.jit
  def step(params, opt, key):
    loss, grads = jax.value_and_grad(loss_fn)(params, None, key, True)
    updates, opt = tx.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt, loss

  opt = tx.init(params)
  losses = []
  for i in range(8):
    params, opt, loss = step(params, opt, jax.random.key(100 + i))
    losses.append(float(loss))
  assert all(np.isfinite(losses)), losses
  assert losses[-1] < 0.8 * losses[0], losses
  fp32 = policy.with_recipe("fp32")  # fp32 validation
  full = jax.jit(loss_fn, static_argnums=(1, 3))(params, fp32, KEY, False)
  assert float(full) < 0.85 * losses[0], (float(full), losses)
