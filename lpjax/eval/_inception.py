"""The FID Inception-v3 (pool3 features, 2048-d) in Flax NNX, with weights from a .npz file.

This is the network of TF-FID (Heusel et al. 2017) as ported by pytorch-fid: torchvision's
Inception-v3 layout (Szegedy et al. 2016) with the FID patches: the average pools of Mixed_5b-d,
Mixed_6b-e and Mixed_7b ignore the zero padding (TF's `count_include_pad=False`), and Mixed_7c's
pool branch is a max pool. Convolutions run in float32 with inference batch norm (eps 1e-3); no
quantization. No weights ship with lpjax and none are downloaded: `load_inception(path)` reads
them from a .npz file whose keys are the PyTorch state-dict names of pytorch-fid's
`fid_inception_v3()`, one array per key in PyTorch layout:

    <layer>.conv.weight        (out, in, kh, kw)   e.g. "Conv2d_1a_3x3.conv.weight",
    <layer>.bn.weight          (out,)                   "Mixed_5b.branch5x5_1.bn.running_mean",
    <layer>.bn.bias            (out,)                   "Mixed_7c.branch3x3dbl_3b.conv.weight"
    <layer>.bn.running_mean    (out,)
    <layer>.bn.running_var     (out,)

for the 94 layers of `layer_names()`. "fc.*" (the 1008-way classifier), "AuxLogits.*" and
"*.num_batches_tracked" entries are ignored. To make the file from pytorch-fid's weights
(github.com/mseitzer/pytorch-fid, release "fid_weights", pt_inception-2015-12-05-6726825d.pth,
itself converted from the TF-FID graph), on a machine with PyTorch:

    import numpy as np, torch
    state = torch.load("pt_inception-2015-12-05-6726825d.pth", map_location="cpu")
    np.savez("fid_inception_v3.npz", **{k: v.numpy() for k, v in state.items()})

Inputs are NHWC images in [-1, 1] (lpjax's image convention, which is what the network expects);
by default they are resized to 299x299 bilinearly (half-pixel centres, as torch's
`F.interpolate(align_corners=False)`; no antialiasing). Any input of at least 75x75 runs without
resizing (the feature map is 1x1 after Mixed_7a at 75x75).

Examples:
  >>> import jax
  >>> graphdef, state = abstract_inception()    # shapes only; load_inception(path) for weights
  >>> params = nnx.state(nnx.merge(graphdef, state), nnx.Param)
  >>> sum(x.size for x in jax.tree.leaves(params))   # torchvision's 27,161,264 minus fc and AuxLogits
  21785568
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

BN_EPS = 1e-3  # TF Inception's batch-norm epsilon


class _Conv(nnx.Module):
  def __init__(self, shape, rngs: nnx.Rngs):
    fan_in = math.prod(shape[:3])  # He init: keeps random-weight activations O(1) through 94 layers
    self.kernel = nnx.Param(jax.random.normal(rngs.params(), shape) * math.sqrt(2 / fan_in))


class _BatchNorm(nnx.Module):
  def __init__(self, n: int):
    self.scale = nnx.Param(jnp.ones((n,)))
    self.bias = nnx.Param(jnp.zeros((n,)))
    self.mean = nnx.BatchStat(jnp.zeros((n,)))
    self.var = nnx.BatchStat(jnp.ones((n,)))


class BasicConv2d(nnx.Module):
  """Conv (no bias) -> batch norm (running statistics) -> ReLU."""

  def __init__(self, n_in: int, n_out: int, kernel, *, stride: int = 1, padding=(0, 0), rngs: nnx.Rngs):
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    ph, pw = (padding, padding) if isinstance(padding, int) else padding
    self.stride, self.padding = stride, ((ph, ph), (pw, pw))
    self.conv = _Conv((kh, kw, n_in, n_out), rngs)
    self.bn = _BatchNorm(n_out)

  def __call__(self, x):
    y = jax.lax.conv_general_dilated(x, self.conv.kernel[...], (self.stride,) * 2, self.padding,
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                     precision=jax.lax.Precision.HIGHEST)
    y = (y - self.bn.mean[...]) * jax.lax.rsqrt(self.bn.var[...] + BN_EPS) * self.bn.scale[...]
    return jax.nn.relu(y + self.bn.bias[...])


def max_pool(x, stride: int, pad: int = 0):
  pads = ((0, 0), (pad, pad), (pad, pad), (0, 0))
  return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, stride, stride, 1), pads)


def avg_pool_3x3_same(x):
  """3x3 stride-1 average over the valid (unpadded) positions only (count_include_pad=False)."""
  pads = ((0, 0), (1, 1), (1, 1), (0, 0))
  total = jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 3, 3, 1), (1, 1, 1, 1), pads)
  count = jax.lax.reduce_window(jnp.ones(x.shape[1:3], x.dtype)[None, :, :, None], 0.0, jax.lax.add,
                                (1, 3, 3, 1), (1, 1, 1, 1), pads)
  return total / count


class InceptionA(nnx.Module):
  def __init__(self, n_in: int, pool_features: int, rngs):
    self.branch1x1 = BasicConv2d(n_in, 64, 1, rngs=rngs)
    self.branch5x5_1 = BasicConv2d(n_in, 48, 1, rngs=rngs)
    self.branch5x5_2 = BasicConv2d(48, 64, 5, padding=2, rngs=rngs)
    self.branch3x3dbl_1 = BasicConv2d(n_in, 64, 1, rngs=rngs)
    self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1, rngs=rngs)
    self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, padding=1, rngs=rngs)
    self.branch_pool = BasicConv2d(n_in, pool_features, 1, rngs=rngs)

  def __call__(self, x):
    b5 = self.branch5x5_2(self.branch5x5_1(x))
    b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
    return jnp.concatenate([self.branch1x1(x), b5, b3, self.branch_pool(avg_pool_3x3_same(x))], -1)


class InceptionB(nnx.Module):
  def __init__(self, n_in: int, rngs):
    self.branch3x3 = BasicConv2d(n_in, 384, 3, stride=2, rngs=rngs)
    self.branch3x3dbl_1 = BasicConv2d(n_in, 64, 1, rngs=rngs)
    self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1, rngs=rngs)
    self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, stride=2, rngs=rngs)

  def __call__(self, x):
    b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
    return jnp.concatenate([self.branch3x3(x), b3, max_pool(x, 2)], -1)


class InceptionC(nnx.Module):
  def __init__(self, n_in: int, c7: int, rngs):
    conv = lambda i, o, k, p: BasicConv2d(i, o, k, padding=p, rngs=rngs)
    self.branch1x1 = conv(n_in, 192, 1, 0)
    self.branch7x7_1 = conv(n_in, c7, 1, 0)
    self.branch7x7_2 = conv(c7, c7, (1, 7), (0, 3))
    self.branch7x7_3 = conv(c7, 192, (7, 1), (3, 0))
    self.branch7x7dbl_1 = conv(n_in, c7, 1, 0)
    self.branch7x7dbl_2 = conv(c7, c7, (7, 1), (3, 0))
    self.branch7x7dbl_3 = conv(c7, c7, (1, 7), (0, 3))
    self.branch7x7dbl_4 = conv(c7, c7, (7, 1), (3, 0))
    self.branch7x7dbl_5 = conv(c7, 192, (1, 7), (0, 3))
    self.branch_pool = conv(n_in, 192, 1, 0)

  def __call__(self, x):
    b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
    d = x
    for layer in (self.branch7x7dbl_1, self.branch7x7dbl_2, self.branch7x7dbl_3, self.branch7x7dbl_4,
                  self.branch7x7dbl_5):
      d = layer(d)
    return jnp.concatenate([self.branch1x1(x), b7, d, self.branch_pool(avg_pool_3x3_same(x))], -1)


class InceptionD(nnx.Module):
  def __init__(self, n_in: int, rngs):
    self.branch3x3_1 = BasicConv2d(n_in, 192, 1, rngs=rngs)
    self.branch3x3_2 = BasicConv2d(192, 320, 3, stride=2, rngs=rngs)
    self.branch7x7x3_1 = BasicConv2d(n_in, 192, 1, rngs=rngs)
    self.branch7x7x3_2 = BasicConv2d(192, 192, (1, 7), padding=(0, 3), rngs=rngs)
    self.branch7x7x3_3 = BasicConv2d(192, 192, (7, 1), padding=(3, 0), rngs=rngs)
    self.branch7x7x3_4 = BasicConv2d(192, 192, 3, stride=2, rngs=rngs)

  def __call__(self, x):
    b3 = self.branch3x3_2(self.branch3x3_1(x))
    b7 = self.branch7x7x3_4(self.branch7x7x3_3(self.branch7x7x3_2(self.branch7x7x3_1(x))))
    return jnp.concatenate([b3, b7, max_pool(x, 2)], -1)


class InceptionE(nnx.Module):
  """Mixed_7b (average pool branch) and Mixed_7c (max pool branch: the FID graph's quirk)."""

  def __init__(self, n_in: int, pool: str, rngs):
    self.pool = pool
    self.branch1x1 = BasicConv2d(n_in, 320, 1, rngs=rngs)
    self.branch3x3_1 = BasicConv2d(n_in, 384, 1, rngs=rngs)
    self.branch3x3_2a = BasicConv2d(384, 384, (1, 3), padding=(0, 1), rngs=rngs)
    self.branch3x3_2b = BasicConv2d(384, 384, (3, 1), padding=(1, 0), rngs=rngs)
    self.branch3x3dbl_1 = BasicConv2d(n_in, 448, 1, rngs=rngs)
    self.branch3x3dbl_2 = BasicConv2d(448, 384, 3, padding=1, rngs=rngs)
    self.branch3x3dbl_3a = BasicConv2d(384, 384, (1, 3), padding=(0, 1), rngs=rngs)
    self.branch3x3dbl_3b = BasicConv2d(384, 384, (3, 1), padding=(1, 0), rngs=rngs)
    self.branch_pool = BasicConv2d(n_in, 192, 1, rngs=rngs)

  def __call__(self, x):
    b3 = self.branch3x3_1(x)
    b3 = jnp.concatenate([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], -1)
    d = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
    d = jnp.concatenate([self.branch3x3dbl_3a(d), self.branch3x3dbl_3b(d)], -1)
    pooled = max_pool(x, 1, pad=1) if self.pool == "max" else avg_pool_3x3_same(x)
    return jnp.concatenate([self.branch1x1(x), b3, d, self.branch_pool(pooled)], -1)


class InceptionV3(nnx.Module):
  """FID Inception-v3 up to the final average pool: images (b, H, W, 3) in [-1, 1] -> (b, 2048)."""

  def __init__(self, *, rngs: nnx.Rngs):
    self.Conv2d_1a_3x3 = BasicConv2d(3, 32, 3, stride=2, rngs=rngs)
    self.Conv2d_2a_3x3 = BasicConv2d(32, 32, 3, rngs=rngs)
    self.Conv2d_2b_3x3 = BasicConv2d(32, 64, 3, padding=1, rngs=rngs)
    self.Conv2d_3b_1x1 = BasicConv2d(64, 80, 1, rngs=rngs)
    self.Conv2d_4a_3x3 = BasicConv2d(80, 192, 3, rngs=rngs)
    self.Mixed_5b = InceptionA(192, 32, rngs)
    self.Mixed_5c = InceptionA(256, 64, rngs)
    self.Mixed_5d = InceptionA(288, 64, rngs)
    self.Mixed_6a = InceptionB(288, rngs)
    self.Mixed_6b = InceptionC(768, 128, rngs)
    self.Mixed_6c = InceptionC(768, 160, rngs)
    self.Mixed_6d = InceptionC(768, 160, rngs)
    self.Mixed_6e = InceptionC(768, 192, rngs)
    self.Mixed_7a = InceptionD(768, rngs)
    self.Mixed_7b = InceptionE(1280, "avg", rngs)
    self.Mixed_7c = InceptionE(2048, "max", rngs)

  def __call__(self, images, *, resize: bool = True):
    x = jnp.asarray(images, jnp.float32)
    if x.ndim != 4 or x.shape[-1] != 3:
      raise ValueError(f"images must be (b, H, W, 3) in [-1, 1], got shape {x.shape}; repeat "
                       "grayscale images to 3 channels first.")
    if resize:
      x = jax.image.resize(x, (x.shape[0], 299, 299, 3), "bilinear", antialias=False)
    elif min(x.shape[1:3]) < 75:
      raise ValueError(f"Inception-v3 needs inputs of at least 75x75, got {x.shape[1:3]}; use resize=True.")
    x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
    x = max_pool(self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(max_pool(x, 2))), 2)
    for block in (self.Mixed_5b, self.Mixed_5c, self.Mixed_5d, self.Mixed_6a, self.Mixed_6b,
                  self.Mixed_6c, self.Mixed_6d, self.Mixed_6e, self.Mixed_7a, self.Mixed_7b, self.Mixed_7c):
      x = block(x)
    return x.mean(axis=(1, 2))


def abstract_inception():
  """(graphdef, abstract state) of InceptionV3, nothing allocated."""
  return nnx.split(nnx.eval_shape(lambda: InceptionV3(rngs=nnx.Rngs(0))))


def layer_names(model: InceptionV3) -> list[str]:
  """The dotted PyTorch names of the 94 conv + batch-norm layers ("Mixed_5b.branch1x1", ...)."""
  return list(_layers(model))


_IGNORED = ("fc.", "AuxLogits.")


def _layers(model) -> dict:
  """{dotted PyTorch name: BasicConv2d} in definition order."""
  return {".".join(str(p) for p in path): m for path, m in nnx.iter_modules(model)
          if isinstance(m, BasicConv2d)}


def load_weights(model: InceptionV3, path: str) -> InceptionV3:
  """Sets every weight of `model` (concrete or abstract) from a pytorch-fid-layout .npz file (see
  the module docstring); missing, unknown or mis-shaped entries raise ValueError."""
  with np.load(path) as data:
    arrays = {k: data[k] for k in data.files}
  arrays = {k: v for k, v in arrays.items()
            if not k.startswith(_IGNORED) and not k.endswith("num_batches_tracked")}
  used, missing = set(), []
  for name, layer in _layers(model).items():
    targets = {"conv.weight": (layer.conv, "kernel"), "bn.weight": (layer.bn, "scale"),
               "bn.bias": (layer.bn, "bias"), "bn.running_mean": (layer.bn, "mean"),
               "bn.running_var": (layer.bn, "var")}
    for suffix, (owner, attr) in targets.items():
      key = f"{name}.{suffix}"
      if key not in arrays:
        missing.append(key)
        continue
      value = arrays[key].astype(np.float32)
      if suffix == "conv.weight":
        value = value.transpose(2, 3, 1, 0)  # PyTorch OIHW -> HWIO
      variable = getattr(owner, attr)
      if value.shape != variable.get_value().shape:
        raise ValueError(f"{path}: {key} has shape {arrays[key].shape}, the FID Inception-v3 needs "
                         f"{variable.get_value().shape} (after OIHW->HWIO for conv weights).")
      variable.set_value(jnp.asarray(value))  # works on an abstract (eval_shape) model too
      used.add(key)
  unknown = sorted(set(arrays) - used)
  if missing or unknown:
    raise ValueError(f"{path} is not a pytorch-fid Inception-v3 state dict: {len(missing)} missing keys "
                     f"(first: {missing[:3]}), {len(unknown)} unknown keys (first: {unknown[:3]}). "
                     "See lpjax/eval/_inception.py's docstring for the expected names and the conversion.")
  return model


def save_weights(model: InceptionV3, path: str) -> None:
  """Writes `model`'s weights in the .npz layout that `load_weights` reads (PyTorch names, OIHW)."""
  arrays = {}
  for name, layer in _layers(model).items():
    arrays[f"{name}.conv.weight"] = np.asarray(layer.conv.kernel[...]).transpose(3, 2, 0, 1)
    arrays[f"{name}.bn.weight"] = np.asarray(layer.bn.scale[...])
    arrays[f"{name}.bn.bias"] = np.asarray(layer.bn.bias[...])
    arrays[f"{name}.bn.running_mean"] = np.asarray(layer.bn.mean[...])
    arrays[f"{name}.bn.running_var"] = np.asarray(layer.bn.var[...])
  np.savez(path, **arrays)


def load_inception(path: str) -> InceptionV3:
  """An InceptionV3 with the weights of the .npz file at `path` (no random initialisation)."""
  return load_weights(nnx.eval_shape(lambda: InceptionV3(rngs=nnx.Rngs(0))), path)


def inception_feature_fn(path: str, *, resize: bool = True):
  """A jitted `feature_fn(images) -> (b, 2048)` float32 numpy for `lpjax.eval.fid`, from the .npz
  weights at `path`. Grayscale (b, H, W, 1) images are repeated to 3 channels."""
  graphdef, state = nnx.split(load_inception(path))

  @jax.jit
  def features(state, images):
    return nnx.merge(graphdef, state)(images, resize=resize)

  def feature_fn(images):
    images = jnp.asarray(images, jnp.float32)
    if images.shape[-1] == 1:
      images = jnp.repeat(images, 3, axis=-1)
    return np.asarray(features(state, images))

  return feature_fn
