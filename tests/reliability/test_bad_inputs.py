"""Bad inputs wherever users reach in fail early with the exception type and a message that names
the problem (and, where there is one, the fix). One table per entry point."""


import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from config_helpers import small

from lpjax import optim, quant
from lpjax.quant import recipes
from lpjax.train import ConfigError, validate

X = jnp.ones((4, 64), jnp.float32)

QUANT_CASES = [
    ("int input", lambda: quant.quantize(jnp.ones((4, 64), jnp.int32), "mxfp4"), TypeError,
     "float array.*cast it first"),
    ("unknown format", lambda: quant.quantize(X, "mxfp5"), ValueError, "mxfp5.*Did you mean"),
    ("unknown rounding", lambda: quant.quantize(X, "mxfp4", rounding="nearest"), ValueError,
     "nearest"),
    ("SR without key", lambda: quant.fake_quant(X, "mxfp4", rounding="stochastic"), ValueError,
     "needs an explicit key"),
    ("axis out of range", lambda: quant.quantize(X, "mxfp4", axis=2), ValueError, "axis"),
    ("bad e8m0 scale mode", lambda: quant.quantize(X, "mxfp4", scale_mode="round"), ValueError,
     "round"),
    ("dequantize of an array", lambda: quant.dequantize(X), TypeError, "needs a QArray"),
    ("unknown recipe", lambda: recipes.get("mxfp44"), ValueError, "mxfp44.*Did you mean"),
    ("nf4 with SR", lambda: quant.quantize(X, "nf4", rounding="stochastic",
                                           key=jnp.zeros((2,), jnp.uint32)), ValueError,
     "nearest_even"),
    ("contracting dim out of range", lambda: quant.dot_general(
        X, jnp.ones((64, 8)), (((2,), (0,)), ((), ())), "bf16"), ValueError,
     "lhs contracting dimension 2 is out of range for an operand of rank 2"),
    ("malformed dimension_numbers", lambda: quant.dot_general(
        X, jnp.ones((64, 8)), ((1,), (0,)), "bf16"), ValueError,
     r"dimension_numbers must be \(\(lhs_contracting"),
    ("einsum with two arrows", lambda: quant.einsum("ab,bc->ac->a", X, jnp.ones((64, 8)),
                                                   recipe="bf16"), ValueError, "is malformed"),
    ("einsum with a stray character", lambda: quant.einsum("ab,b1->a", X, jnp.ones((64, 8)),
                                                          recipe="bf16"), ValueError, "'1'"),
    ("einsum output index in no operand", lambda: quant.einsum("ab,bc->az", X, jnp.ones((64, 8)),
                                                              recipe="bf16"), ValueError, "'z'"),
    ("a batch of keys", lambda: quant.fake_quant(X, "mxfp4", rounding="stochastic",
                                                 key=jax.random.split(jax.random.key(0), 3)),
     ValueError, "one jax.random key, got an array of keys of shape"),
    ("empty raw key", lambda: quant.fake_quant(X, "mxfp4", rounding="stochastic",
                                               key=jnp.zeros((0,), jnp.uint32)),
     ValueError, "raw uint32 key data must have shape"),
]

OPTIM_CASES = [
    ("b1 of 1", lambda: optim.stable_spam(1e-3, b1=1.0), r"b1 must be in \[0, 1\)"),
    ("gamma1 of 1", lambda: optim.stable_spam(1e-3, gamma1=1.0), r"gamma1 must be in \[0, 1\)"),
    ("negative total_steps", lambda: optim.stable_spam(1e-3, total_steps=-1), "total_steps must be positive"),
    ("integer mu_dtype", lambda: optim.stable_spam(1e-3, mu_dtype=jnp.int32), "floating dtype"),
    ("spam b2 of 1", lambda: optim.spam(1e-3, b2=1.0), r"b2 must be in \[0, 1\)"),
    ("negative eps", lambda: optim.spam(1e-3, eps=-1e-8), "eps must be a finite number > 0"),
]


@pytest.mark.parametrize("name,call,match", OPTIM_CASES, ids=[c[0] for c in OPTIM_CASES])
def test_optim_rejects(name, call, match):
  with pytest.raises(ValueError, match=match):
    call()


@pytest.mark.parametrize("make", [optim.stable_spam, optim.spam], ids=["stable_spam", "spam"])
def test_integer_params_move_as_optax_adam_moves_them(make):
  # Integer leaves used to get float moments truncated to int: every update was -0.0.
  import optax
  params = {"w": jnp.array([1, 2, 3], jnp.int32), "f": jnp.ones(2)}
  grads = {"w": jnp.array([1, -1, 0], jnp.int32), "f": jnp.ones(2)}
  tx, adam = make(0.1), optax.adam(0.1)
  updates, _ = tx.update(grads, tx.init(params), params)
  reference, _ = adam.update(grads, adam.init(params), params)
  assert updates["w"].dtype == jnp.float32
  np.testing.assert_allclose(updates["w"], reference["w"], rtol=1e-4)  # -0.1, +0.1, 0


@pytest.mark.parametrize("fmt", ["nvfp4", "uint4_g128"])
@pytest.mark.parametrize("magnitude", [3e38])
def test_finite_inputs_below_flt_max_quantize_to_finite_values(fmt, magnitude):
  # NVFP4 used to return +inf for |x| >= ~7.6e35 and uint4 NaN / Inf for groups spanning
  # more than FLT_MAX (docs/numerics.md §5 and the uint4 rule; oracle parity in
  # tests/quant/test_huge_values.py).
  x = jnp.asarray(np.linspace(-magnitude, magnitude, 256, dtype=np.float32).reshape(2, 128))
  values = np.asarray(quant.fake_quant(x, fmt))
  assert np.isfinite(values).all()
  np.testing.assert_allclose(values, np.asarray(x), atol=0.2 * magnitude)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "fp8_e4m3", "int8_channel", "uint4_g128"])
@pytest.mark.parametrize("shape", [(0, 32), (4, 0), (0,)])
def test_empty_arrays_quantize_to_empty_results(fmt, shape):
  x = jnp.zeros(shape, jnp.float32)
  q = quant.quantize(x, fmt)
  assert quant.dequantize(q).shape == shape and quant.fake_quant(x, fmt).shape == shape
  assert q.codes.size == 0 and q.shape == shape


@pytest.mark.parametrize("name,call,error,match", QUANT_CASES, ids=[c[0] for c in QUANT_CASES])
def test_quant_rejects(name, call, error, match):
  with pytest.raises(error, match=match):
    call()


def _as_dict_config(**changes):
  """A config written as a plain dict (no ConfigDict type safety), with `changes` applied."""
  d = small().to_dict()
  for key, value in changes.items():
    node = d
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return ml_collections.ConfigDict(d)


CONFIG_CASES = [
    ("unknown key", lambda: _with_extra("optimizer.lrr", 1e-3), "optimizer.lrr"),
    ("string for int", lambda: _as_dict_config(steps="100"), "steps must be a int.*'100'"),
    ("float for int", lambda: _as_dict_config(batch_size=8.0), "batch_size must be a int"),
    ("bool for float", lambda: _as_dict_config(**{"optimizer.lr": True}), "optimizer.lr must be a float"),
    ("impossible mesh", lambda: small(**{"mesh.data": 2, "mesh.fsdp": 2}), "Impossible mesh"),
    ("fsdp not dividing", lambda: small(**{"mesh.fsdp": 3}), "does not divide"),
    ("batch not divisible", lambda: small(batch_size=12), "not divisible"),
    ("sequence too long", lambda: small(**{"model.max_seq_len": 16}), "exceeds model.max_seq_len"),
    ("curriculum too long", lambda: small(**{"data.seq_len_schedule": "64:0.5"}), "seq_len_schedule"),
    ("tokenizer missing", lambda: small(**{"data.tokenizer": "/no/spiece.model"}), "SentencePiece"),
    ("unknown recipe", lambda: small(**{"quant.recipe": "mxfp5"}), "mxfp5"),
    ("phases over 1", lambda: small(**{"quant.qaf_fraction": 0.6, "quant.finish_fraction": 0.5}),
     "qaf_fraction.*<= 1"),
    ("negative phase", lambda: small(**{"quant.qaf_fraction": -0.1}), "quant.qaf_fraction=-0.1"),
    ("keep fraction 1", lambda: small(**{"quant.keep_last_fraction": 1.0}), "keep_last_fraction"),
    ("unknown optimizer", lambda: small(**{"optimizer.name": "sgd"}), "valid: adamw"),
    ("unknown param rounding", lambda: small(**{"optimizer.param_rounding": "floor"}),
     "param_rounding must be 'stochastic' or 'nearest'"),
    ("float16 master weights", lambda: small(**{"model.param_dtype": "float16"}),
     "model.param_dtype must be 'float32' or 'bfloat16'"),
    ("unknown task", lambda: small(task="segmentation"), "task 'segmentation'"),
    ("lm with a resnet", lambda: small(**{"model.name": "resnet18"}), "task='classification'"),
    ("classification with a unet", lambda: small(task="classification", **{
        "model.name": "unet_tiny", "data.source": "digits"}), "not a classification model"),
    ("text source for images", lambda: small(task="classification", **{
        "model.name": "resnet_tiny"}), "not an image source"),
    ("tfds without a name", lambda: small(**{"data.source": "tfds"}), "needs data.tfds_name"),
    ("no checkpoints kept", lambda: small(keep_checkpoints=0), "keep_checkpoints must be >= 1"),
    ("negative eval_every", lambda: small(eval_every=-1), "eval_every must be >= 0"),
    ("zero steps", lambda: small(steps=0), "steps must be positive"),
    ("NaN learning rate", lambda: small(**{"optimizer.lr": float("nan")}), r"optimizer.lr must be a finite number >= 0, got nan"),
    ("negative learning rate", lambda: small(**{"optimizer.lr": -1e-3}), "optimizer.lr must be"),
    ("infinite learning rate", lambda: small(**{"optimizer.lr": float("inf")}), "optimizer.lr must be"),
    ("negative min_lr_ratio", lambda: small(**{"optimizer.min_lr_ratio": -0.1}), r"min_lr_ratio must be in \[0, 1\]"),
    ("negative warmup", lambda: small(**{"optimizer.warmup_steps": -1}), "warmup_steps must be >= 0"),
    ("b2 above 1", lambda: small(**{"optimizer.b2": 1.5}), r"optimizer.b2 must be in \[0, 1\)"),
    ("b1 of 1", lambda: small(**{"optimizer.b1": 1.0}), r"optimizer.b1 must be in \[0, 1\)"),
    ("gamma1 of 1", lambda: small(optimizer="stable_spam", **{"optimizer.gamma1": 1.0}), "optimizer.gamma1 must be"),
    ("negative grad_clip", lambda: small(**{"optimizer.grad_clip": -1.0}), "grad_clip must be"),
    ("NaN weight decay", lambda: small(**{"optimizer.weight_decay": float("nan")}), "weight_decay must be"),
    ("zero eps", lambda: small(**{"optimizer.eps": 0.0}), "optimizer.eps must be a finite number > 0"),
    ("zero eval_steps", lambda: small(eval_steps=0), "eval_steps must be >= 1"),
    ("vocab smaller than the tokenizer's", lambda: small(**{"model.vocab_size": 100}), "smaller than the tokenizer's 257"),
    ("negative vocab", lambda: small(**{"model.vocab_size": -5}), "vocab_size must be >= 0"),
    ("keep_last beyond the blocks", lambda: small(**{"quant.keep_last": 99}), "exceeds the model's"),
    ("negative keep_first", lambda: small(**{"quant.keep_first": -1}), "keep_first must be >= 0"),
    ("malformed curriculum", lambda: small(**{"data.seq_len_schedule": "32;0.5"}), "is not 'seq_len:fraction'"),
    ("curriculum fraction above 1", lambda: small(**{"data.seq_len_schedule": "16:1.5"}), r"fraction 1.5 must be in \[0, 1\]"),
    ("missing FID checkpoint", lambda: small(task="diffusion", **{
        "model.name": "unet_tiny", "data.source": "digits",
        "diffusion.fid_inception_path": "/no/inception.npz"}), "fid_inception_path"),
]


def _with_extra(key, value):
  c = small()
  section, leaf = key.split(".")
  with c.unlocked():
    c[section][leaf] = value
  return c


@pytest.mark.parametrize("name,make,match", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_config_rejects_before_compiling(name, make, match):
  with pytest.raises(ConfigError, match=match):
    validate(make(), device_count=8)


def test_every_config_problem_is_reported_at_once():
  c = small(eval_steps=0, **{"optimizer.lr": float("nan"), "optimizer.b2": 2.0, "mesh.fsdp": 3,
                             "model.vocab_size": 7})
  with pytest.raises(ConfigError) as e:
    validate(c, device_count=8)
  lines = str(e.value).splitlines()
  assert lines[0] == "5 problems in the config:"
  for text in ("eval_steps", "optimizer.lr", "optimizer.b2", "does not divide", "vocab_size 7"):
    assert sum(text in line for line in lines[1:]) == 1, text


def test_train_py_prints_a_config_error_without_a_traceback(tmp_path):
  import subprocess
  import sys

  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  cmd = [sys.executable, os.path.join(root, "train.py"), "--config",
         os.path.join(root, "configs", "llama_tiny_mxfp4.py"), "--config.optimizer.lr=-1",
         "--config.eval_steps=0", f"--workdir={tmp_path}"]
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 2, out.stderr[-2000:]
  assert "Traceback" not in out.stderr
  assert "2 problems in the config" in out.stderr and "optimizer.lr must be" in out.stderr


def test_data_rejects_missing_text_files(tmp_path):
  from lpjax import data
  with pytest.raises(FileNotFoundError, match="No text files match.*data.path"):
    data.make_dataset("text", path=str(tmp_path / "*.txt"), cache_dir=str(tmp_path))


def test_data_rejects_a_missing_tokenizer_file(tmp_path):
  from lpjax import data
  with pytest.raises(FileNotFoundError, match="spiece.model"):
    data.get_tokenizer(str(tmp_path / "spiece.model"))


def test_unprepared_tfds_text_dataset_names_the_prepare_command(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  from lpjax import data
  with pytest.raises(FileNotFoundError, match=r"tfds build c4/en --file_format=array_record "
                                              r"--data_dir=" + str(tmp_path)):
    data.make_dataset("tfds", tfds_name="c4/en", tfds_data_dir=str(tmp_path))


def test_unprepared_tfds_image_dataset_names_the_prepare_command(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  from lpjax.data import make_image_dataset
  with pytest.raises(FileNotFoundError, match=r"tfds build cifar10.*array_record"):
    make_image_dataset("tfds", tfds_name="cifar10", data_dir=str(tmp_path))


def test_unknown_tfds_dataset_is_named(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  from lpjax import data
  with pytest.raises(ValueError, match="'no_such_corpus' is unknown"):
    data.make_dataset("tfds", tfds_name="no_such_corpus", tfds_data_dir=str(tmp_path))


def test_a_model_longer_than_its_rope_table_is_refused():
  import jax
  from lpjax.models import llama
  cfg = llama.LlamaConfig(vocab_size=11, hidden=32, intermediate=64, heads=2, layers=1,
                          max_seq_len=8)
  graphdef, _ = llama.abstract_model(cfg)
  params = llama.init_params(cfg, jax.random.key(0))
  with pytest.raises(ValueError, match="exceeds the model's max_seq_len 8"):
    llama.apply(graphdef, cfg, params, np.zeros((1, 9), np.int32), None, jax.random.key(0))
