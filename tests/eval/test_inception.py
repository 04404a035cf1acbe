"""lpjax.eval._inception: the FID Inception-v3 layout, .npz loading, and a forward pass at 75x75.

Random weights only (no checkpoint ships with lpjax); the 299x299 path with real weights is for the
benchmarks, not the tests (a CPU forward at 299 takes too long here).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lpjax.eval import _inception as inception


def abstract_layers():
  graphdef, state = inception.abstract_inception()
  return inception._layers(nnx.merge(graphdef, state))


def random_state_dict(rng):
  """A pytorch-fid-layout state dict (OIHW kernels, He init) with non-trivial batch-norm stats."""
  out = {}
  for name, layer in abstract_layers().items():
    kh, kw, cin, cout = layer.conv.kernel.get_value().shape
    he = np.sqrt(2 / (kh * kw * cin))
    out[f"{name}.conv.weight"] = (rng.normal(size=(cout, cin, kh, kw)) * he).astype(np.float32)
    out[f"{name}.bn.weight"] = rng.uniform(0.8, 1.2, cout).astype(np.float32)
    out[f"{name}.bn.bias"] = rng.normal(0, 0.1, cout).astype(np.float32)
    out[f"{name}.bn.running_mean"] = rng.normal(0, 0.1, cout).astype(np.float32)
    out[f"{name}.bn.running_var"] = rng.uniform(0.8, 1.2, cout).astype(np.float32)
  return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  state = random_state_dict(np.random.default_rng(0))
  path = tmp_path_factory.mktemp("inception") / "fid_inception.npz"
  extras = {"fc.weight": np.zeros((1008, 2048), np.float32),
            "Conv2d_1a_3x3.bn.num_batches_tracked": np.zeros(())}
  np.savez(path, **state, **extras)  # fc and num_batches_tracked are ignored
  return str(path), state


def test_layout_matches_torchvision():
  graphdef, state = inception.abstract_inception()
  params = nnx.state(nnx.merge(graphdef, state), nnx.Param)
  # torchvision's inception_v3 has 27,161,264 parameters; without fc (2,049,000) and AuxLogits
  # (3,326,696) that leaves 21,785,568.
  assert sum(x.size for x in jax.tree.leaves(params)) == 27_161_264 - 2_049_000 - 3_326_696
  names = inception.layer_names(nnx.merge(graphdef, state))
  assert len(names) == 94 and names[0] == "Conv2d_1a_3x3" and "Mixed_7c.branch3x3dbl_3b" in names


def test_loaded_first_layer_matches_a_numpy_conv_bn_relu(checkpoint):
  path, state = checkpoint
  layer = inception.load_inception(path).Conv2d_1a_3x3
  x = np.random.default_rng(1).uniform(-1, 1, (1, 7, 7, 3)).astype(np.float32)
  w = state["Conv2d_1a_3x3.conv.weight"]  # (32, 3, 3, 3) OIHW, stride 2, no padding
  conv = np.zeros((1, 3, 3, 32))
  for i in range(3):
    for j in range(3):
      conv[0, i, j] = np.einsum("hwc,ochw->o", x[0, 2 * i:2 * i + 3, 2 * j:2 * j + 3], w)
  bn = lambda k: state[f"Conv2d_1a_3x3.bn.{k}"]
  normed = (conv - bn("running_mean")) / np.sqrt(bn("running_var") + 1e-3)
  want = np.maximum(normed * bn("weight") + bn("bias"), 0)
  np.testing.assert_allclose(layer(jnp.asarray(x)), want, rtol=1e-4, atol=1e-5)


def test_feature_fn_gives_pool3_features_at_75x75(checkpoint):
  path, _ = checkpoint
  feature_fn = inception.inception_feature_fn(path, resize=False)
  images = np.random.default_rng(2).uniform(-1, 1, (2, 75, 75, 1)).astype(np.float32)  # grayscale ok
  feats = feature_fn(images)
  assert feats.shape == (2, 2048) and feats.dtype == np.float32
  assert np.all(np.isfinite(feats)) and np.all(feats >= 0) and feats.std() > 0  # post-ReLU means
  assert np.abs(feats[0] - feats[1]).max() > 0


def test_save_and_load_round_trip(checkpoint, tmp_path):
  path, state = checkpoint
  inception.save_weights(inception.load_inception(path), str(tmp_path / "again.npz"))
  with np.load(tmp_path / "again.npz") as again:
    assert set(again.files) == set(state)
    for k in state:
      np.testing.assert_array_equal(again[k], state[k])


def test_wrong_checkpoints_raise(checkpoint, tmp_path):
  _, state = checkpoint
  missing = dict(state)
  del missing["Mixed_6b.branch7x7_2.conv.weight"]
  np.savez(tmp_path / "missing.npz", **missing)
  with pytest.raises(ValueError, match="1 missing keys"):
    inception.load_inception(str(tmp_path / "missing.npz"))
  np.savez(tmp_path / "unknown.npz", **state, **{"Mixed_9z.conv.weight": np.zeros(1)})
  with pytest.raises(ValueError, match="1 unknown keys"):
    inception.load_inception(str(tmp_path / "unknown.npz"))
  wrong = dict(state, **{"Conv2d_1a_3x3.conv.weight": np.zeros((32, 3, 5, 5), np.float32)})
  np.savez(tmp_path / "wrong.npz", **wrong)
  with pytest.raises(ValueError, match="has shape"):
    inception.load_inception(str(tmp_path / "wrong.npz"))


def test_small_inputs_need_resizing():
  graphdef, state = inception.abstract_inception()
  model = nnx.merge(graphdef, state)
  with pytest.raises(ValueError, match="at least 75x75"):
    model(jnp.zeros((1, 32, 32, 3)), resize=False)
  with pytest.raises(ValueError, match="repeat grayscale"):
    model(jnp.zeros((1, 32, 32, 1)))


def test_resize_is_torch_bilinear_without_align_corners():
  # F.interpolate(mode="bilinear", align_corners=False) upsampling: src = (dst + 0.5) * in / out - 0.5,
  # clamped at 0, neighbours clamped at the edge.
  x = np.random.default_rng(3).normal(size=(5, 4)).astype(np.float32)
  def axis_weights(n_in, n_out):
    m = np.zeros((n_out, n_in))
    for d in range(n_out):
      src = max((d + 0.5) * n_in / n_out - 0.5, 0.0)
      lo = min(int(np.floor(src)), n_in - 1)
      hi = min(lo + 1, n_in - 1)
      m[d, lo] += 1 - (src - lo)
      m[d, hi] += src - lo
    return m
  want = axis_weights(5, 12) @ x @ axis_weights(4, 9).T
  got = jax.image.resize(jnp.asarray(x), (12, 9), "bilinear", antialias=False)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
