"""The bad-input table (issue 40): data files, flags, workdirs, library calls and optimizers.

Each case is one row with its expected outcome: an exception type and a message substring (the
trainer's errors are ConfigError subclasses, which train.py prints as one line with exit status
2), or a property of the result. The command-line rows run `train.py` itself, all at once in a
module fixture; the others call the same functions in-process (train.py's `_parse_flags` runs
`lpjax.train._cli`, the Trainer runs `lpjax.train._preflight`), so the table costs seconds.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl import flags

from config_helpers import override, small

from lpjax import data as lpdata
from lpjax import optim, quant
from lpjax.train import ConfigError, validate
from lpjax.train import _cli as cli
from lpjax.train import _preflight as preflight

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LATIN1 = b"hello caf\xe9 world\n"  # 'caf\xe9' is Latin-1; byte 9 is not UTF-8 there
BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xd8\xff"


class Raises(NamedTuple):
  error: type
  match: str  # a substring of the message


class Holds(NamedTuple):
  what: str  # the property the call returns True for


class Case(NamedTuple):
  group: str
  name: str
  run: Callable  # run(tmp_path) -> the checked value
  expect: Raises | Holds


# --- helpers ------------------------------------------------------------------------------------


def _file(tmp_path, name, content: bytes):
  path = tmp_path / name
  path.write_bytes(content)
  return str(path)


def _text(tmp_path, content=b"", name="corpus.txt", n=6000):
  return _file(tmp_path, name, content or (b"the quick brown fox jumps over the lazy dog. " * n)[:n])


def _validate(c):
  return validate(c, device_count=8)


_VISION_MODEL = {"classification": "resnet_tiny", "diffusion": "unet_tiny"}


def _with(task="lm", **overrides):
  """A small valid config of `task` (tiny LLaMA, or the tiny ResNet / U-Net on digits)."""
  if task == "lm":
    return small(**overrides)
  from lpjax.train._vision_configs import vision_config
  return override(vision_config(_VISION_MODEL[task]), batch_size=8, **overrides)


def _cli_validate(*args, task="lm"):
  """train.py's path for --config.x=y overrides of keys the config lacks, in-process."""
  c = _with(task)
  kept, unknown = cli.split_overrides(["train.py", *args], c)
  assert kept == ["train.py"]
  return _validate(cli.add_overrides(c, unknown))


def _flag_message(text):
  return cli.flag_error_message(flags.IllegalFlagValueError(text), small())


def _text_tokens(tmp_path, content, **kwargs):
  ds = lpdata.text_dataset(_file(tmp_path, "doc.txt", content), "byte",
                           cache_root=str(tmp_path / "cache"), **kwargs)
  return np.concatenate([ds.train_tokens, ds.eval_tokens]).tolist()


def _utf8_tokens(text):
  return list(text.encode("utf-8")) + [lpdata.ByteTokenizer.eos_id]


def _replace_then_strict(tmp_path):
  """A cache built with errors='replace' must not let a strict read of the same file succeed."""
  path = _file(tmp_path, "doc.txt", LATIN1)
  lpdata.text_dataset(path, "byte", cache_root=str(tmp_path / "cache"), errors="replace")
  try:
    lpdata.text_dataset(path, "byte", cache_root=str(tmp_path / "cache"))
  except ValueError as e:
    return "byte offset 9" in str(e)
  return False


def _trainer_too_small_eval(tmp_path):
  """The Trainer stops before its optimizer and train step exist, and the workdir stays empty of
  checkpoints and metrics."""
  from lpjax.train import Trainer

  c = _with(**{"data.source": "text", "data.path": _text(tmp_path, n=300),
               "data.cache_dir": str(tmp_path / "cache")})
  workdir = tmp_path / "run"
  try:
    Trainer(c, str(workdir))
  except preflight.DataError as e:
    left = sorted(os.listdir(workdir)) if workdir.exists() else []
    assert left == [], left
    raise e
  return None


def _check_dataset_logs(tmp_path, caplog, dataset, config, words):
  with caplog.at_level(logging.INFO, logger="lpjax.train"):
    preflight.check_dataset(config, dataset)
  text = " ".join(r.getMessage() for r in caplog.records)
  return all(w in text for w in words)


def _boundary_split():
  ds = lpdata.TokenStreamDataset(np.arange(18, dtype=np.uint16), np.arange(18, dtype=np.uint16),
                                 vocab_size=257, name="short")
  summary = preflight.check_dataset(override(_with(), seq_len=16), ds)
  train, evaluation = ds.train_batch(0, 8, 16, seed=0), ds.eval_batch(0, 8, 16)
  return ("short: 18 training and 18 evaluation tokens" in summary
          and train["inputs"].shape == evaluation["inputs"].shape == (8, 16))


def _data_errors_convert(tmp_path):
  with preflight.data_errors():
    lpdata.make_dataset("text", path=str(tmp_path / "missing.txt"), cache_dir=str(tmp_path))


def _cache_under_a_file(tmp_path):
  with preflight.data_errors():
    lpdata.text_dataset(_text(tmp_path), "byte", cache_root=_file(tmp_path, "cache", b"x"))


def _unprepared_tfds(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  with preflight.data_errors():
    lpdata.make_dataset("tfds", tfds_name="c4/en", tfds_data_dir=str(tmp_path))


def _data_errors_pass_through(tmp_path):
  try:
    with preflight.data_errors():
      raise ValueError("not a data problem")
  except ValueError as e:
    return not isinstance(e, ConfigError)
  return False


def _unwritable_workdir(tmp_path, monkeypatch):
  def refuse(*args, **kwargs):
    raise PermissionError(13, "Permission denied")
  monkeypatch.setattr(preflight.tempfile, "mkstemp", refuse)
  preflight.prepare_workdir(str(tmp_path / "run"))


def _tfds_not_installed(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import raises ImportError
  with preflight.data_errors():
    lpdata.make_dataset("tfds", tfds_name="c4/en", tfds_data_dir=str(tmp_path))


def _home_workdir(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))
  return preflight.prepare_workdir(os.path.join("~", "runs", "a")) == str(tmp_path / "runs" / "a")


KEY = jax.random.key(0)


def _gemm_empty(recipe, lhs_shape, rhs_shape):
  """dot_general of `recipe` on zero-size operands: the shape of lax's result, zeros where the
  contraction is empty (lax's result, the reference), and gradients of the operands' shapes."""
  x, w = jnp.ones(lhs_shape), jnp.ones(rhs_shape)
  dn = (((x.ndim - 1,), (0,)), ((), ()))
  gemm = lambda x, w: quant.dot_general(x, w, dn, recipe, key=KEY)
  y = jax.jit(gemm)(x, w)  # jitted: eager dispatch of the recipe's many small ops is slow
  reference = jax.lax.dot_general(x, w, dn)
  gx, gw = jax.jit(jax.grad(lambda x, w: jnp.sum(gemm(x, w)), (0, 1)))(x, w)
  return (y.shape == reference.shape and bool(jnp.all(y == reference))
          and gx.shape == x.shape and gw.shape == w.shape
          and bool(jnp.all(jnp.isfinite(gx))) and bool(jnp.all(jnp.isfinite(gw))))


def _every_format_takes_empty_arrays():
  for fmt in quant.FORMAT_NAMES:
    for shape in [(0, 64), (4, 0), (2, 0, 32)]:
      x = jnp.zeros(shape, jnp.float32)
      if quant.dequantize(quant.quantize(x, fmt)).shape != shape:
        return False
      if quant.fake_quant(x, fmt).shape != shape:
        return False
  return True


def _nan_tensor_amax(amax):
  x = jax.random.normal(jax.random.key(1), (4, 64))
  q = quant.quantize(x, "nvfp4", tensor_amax=amax)
  deq = quant.dequantize(q)
  fake = quant.fake_quant(x, "nvfp4", tensor_amax=amax)
  return (bool(jnp.all(jnp.isnan(deq))) and bool(jnp.all(jnp.isnan(fake)))
          and bool(jnp.all(q.scales.view(jnp.uint8) == 0x7F) if q.scales.dtype.itemsize == 1
                   else jnp.all(q.scales == 0x7F))
          and bool(jnp.all(q.codes == 0)))


def _pallas_agrees_on_a_nan_tensor_amax():
  """The Pallas kernels (interpret mode off GPU) give the XLA path's bits for non-finite amax."""
  x = jax.random.normal(jax.random.key(1), (16, 64))
  for amax in (float("inf"), float("nan")):
    q, qx = (quant.quantize(x, "nvfp4", tensor_amax=amax, impl=i) for i in ("pallas", "xla"))
    y, yx = (quant.fake_quant(x, "nvfp4", tensor_amax=amax, impl=i) for i in ("pallas", "xla"))
    if not (bool(jnp.all(q.codes == qx.codes)) and bool(jnp.all(q.scales == qx.scales))
            and bool(jnp.all(y.view(jnp.uint32) == yx.view(jnp.uint32)))):
      return False
  return True


def _finite_tensor_amax_is_the_measured_one():
  x = jax.random.normal(jax.random.key(2), (4, 64))
  given = quant.fake_quant(x, "nvfp4", tensor_amax=jnp.max(jnp.abs(x)))
  return bool(jnp.all(given.view(jnp.uint32) == quant.fake_quant(x, "nvfp4").view(jnp.uint32)))


def _first_update(tx, grad):
  params = {"w": jnp.ones(grad.shape)}
  updates, state = jax.jit(tx.update)({"w": grad}, tx.init(params), params)
  return updates["w"], state


def _huge_first_step_is_scale_free(magnitude):
  """Stable-SPAM's first step normalizes the gradient (AdaGN at k=1 gives target n / (n + eps)),
  so a huge finite gradient moves the params as the same gradient scaled down by 2**-100 does."""
  g = jax.random.uniform(jax.random.key(3), (64, 64), minval=-1.0) * magnitude  # finite
  tx = optim.stable_spam(1e-3)
  huge, state = _first_update(tx, g)
  small_, _ = _first_update(tx, g * 2.0**-100)
  assert bool(jnp.all(jnp.isfinite(g)))
  finite = all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(state))
  return finite and bool(jnp.all(jnp.isfinite(huge))) and np.allclose(huge, small_, rtol=1e-5,
                                                                       atol=1e-9)


def _keeps_training_after_a_spike(make, magnitude, spike_steps=(5, 30)):
  """Params and optimizer state stay finite through spikes of `magnitude`, and the steps after
  them still move the params (no state stuck at inf)."""
  tx = make()
  params = {"w": jnp.ones((16, 16)), "b": jnp.ones(3)}
  state = tx.init(params)

  @jax.jit
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for t in range(40):
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 0.01 * (1 + t % 3)), params)
    if t in spike_steps:
      grads = {"w": grads["w"].at[0].set(magnitude), "b": grads["b"].at[0].set(-magnitude)}
    before = params
    params, state = step(params, state, grads)
  finite = all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves((params, state)))
  moved = bool(jnp.any(params["w"] != before["w"]))
  return finite and moved


def _scaled_norm_matches_float64(values):
  from lpjax.optim._safe_norms import scaled_norm
  x = np.asarray(values, np.float32)
  norm, scaled, down = scaled_norm(jnp.asarray(x))
  want = np.sqrt(np.sum(np.square(x.astype(np.float64))))
  unit = np.asarray(jnp.asarray(x) * down / scaled, np.float64)
  return (np.isclose(float(norm), want, rtol=1e-6) if want < np.finfo(np.float32).max
          else np.isinf(float(norm))) and np.allclose(unit, x / want, rtol=1e-6, atol=1e-30)


def _scaled_norm_is_the_plain_norm_bit_for_bit():
  from lpjax.optim._safe_norms import scaled_norm
  for seed in range(5):
    x = jax.random.normal(jax.random.key(seed), (33, 17)) * 10.0 ** (seed - 2)
    if scaled_norm(x)[0].view(jnp.uint32) != jnp.sqrt(jnp.sum(jnp.square(x))).view(jnp.uint32):
      return False
  return True


# --- the table ----------------------------------------------------------------------------------

CE, DE, WE = ConfigError, preflight.DataError, preflight.WorkdirError

CASES = [
    # flags: train.py's path for --config.x=y (lpjax.train._cli, then validate)
    Case("flags", "typo in a section key", lambda t: _cli_validate("--config.optimizer.lrr=2e-3"),
         Raises(CE, "optimizer.lrr (did you mean optimizer.lr?)")),
    Case("flags", "typo in a top-level key", lambda t: _cli_validate("--config.seq_lenn=64"),
         Raises(CE, "seq_lenn (did you mean seq_len?)")),
    Case("flags", "misspelt section", lambda t: _cli_validate("--config.optimiser.lr=1e-3"),
         Raises(CE, "optimiser.lr (did you mean optimizer.lr?)")),
    Case("flags", "another task's data key", lambda t: _cli_validate("--config.data.image_size=32"),
         Raises(CE, "data.image_size applies to tasks 'classification' and 'diffusion' only")),
    Case("flags", "another task's section",
         lambda t: _cli_validate("--config.diffusion.timesteps=50"),
         Raises(CE, "diffusion.timesteps applies to task 'diffusion' only")),
    Case("flags", "lm key on an image task", lambda t: _cli_validate("--config.seq_len=64",
                                                                     task="classification"),
         Raises(CE, "seq_len applies to task 'lm' only")),
    Case("flags", "unknown section", lambda t: _cli_validate("--config.foo.bar=1"),
         Raises(CE, "Unknown config key(s): foo.bar")),
    Case("flags", "a key under a value", lambda t: _cli_validate("--config.optimizer.lr.warm=1"),
         Raises(CE, "optimizer.lr is a value, not a section")),
    Case("flags", "misspelt boolean switch", lambda t: _cli_validate("--config.progress_barr"),
         Raises(CE, "progress_barr (did you mean progress_bar?)")),
    Case("flags", "two-token override is taken out whole",
         lambda t: cli.split_overrides(["train.py", "--config.optimizer.lrr", "0.1", "--workdir=w"],
                                       small()) == (["train.py", "--workdir=w"],
                                                    [("optimizer.lrr", "0.1")]),
         Holds("the value token goes with its unknown key")),
    Case("flags", "known keys stay with ml_collections",
         lambda t: cli.split_overrides(["train.py", "--config.optimizer.lr=2e-3",
                                        "--config.quant.loss_scale"], small())[1] == [],
         Holds("nothing taken out")),
    Case("flags", "int key given a float",
         lambda t: "--config.steps must be an int (like its default 3)" in _flag_message(
             "flag --config.steps=1.5: invalid literal for int() with base 10: '1.5'"),
         Holds("one line naming the key, its type and default")),
    Case("flags", "a section given a value",
         lambda t: "--config.optimizer is a section" in _flag_message(
             "flag --config.optimizer=3: Failed to parse '3' as a ConfigDict"),
         Holds("the fix names one of its keys")),
    Case("flags", "no --config",
         lambda t: "--config is required" in _flag_message(
             "flag --config=None: Flag --config must have a value other than None."),
         Holds("names the flag and an example")),
    Case("flags", "--config in either form",
         lambda t: (cli.config_path_of(["t", "--config=a.py"]), cli.config_path_of(
             ["t", "--config", "b.py"]), cli.config_path_of(["t", "--workdir=x"])) == (
                 "a.py", "b.py", None),
         Holds("found with '=' or as the next token")),

    # config: data.* keys against the source that reads them, and the text corpus settings
    Case("config", "data.path with the embedded corpus",
         lambda t: _validate(_with(**{"data.path": "x.txt"})),
         Raises(CE, "data.path='x.txt' is not read by data.source='embedded'")),
    Case("config", "data.text_key with a text corpus",
         lambda t: _validate(_with(**{"data.source": "text", "data.path": _text(t),
                                      "data.text_key": "body"})),
         Raises(CE, "data.text_key='body' is not read by data.source='text' (only by 'tfds')")),
    Case("config", "data.tfds_reader with the embedded corpus",
         lambda t: _validate(_with(**{"data.tfds_reader": "tf_data"})),
         Raises(CE, "data.tfds_reader='tf_data' is not read by data.source='embedded'")),
    Case("config", "data.encoding with TFDS",
         lambda t: _validate(_with(**{"data.source": "tfds", "data.tfds_name": "c4/en",
                                      "data.encoding": "latin-1"})),
         Raises(CE, "data.encoding='latin-1' is not read by data.source='tfds' (only by 'text')")),
    Case("config", "data.cache_dir with TFDS text",
         lambda t: _validate(_with(**{"data.source": "tfds", "data.tfds_name": "c4/en",
                                      "data.cache_dir": "/tmp/c"})),
         Raises(CE, "data.cache_dir='/tmp/c' is not read by data.source='tfds'")),
    Case("config", "data.cache_dir with digits",
         lambda t: _validate(_with("classification", **{"data.cache_dir": "/tmp/c"})),
         Raises(CE, "data.cache_dir='/tmp/c' is not read by data.source='digits'")),
    Case("config", "data.tfds_data_dir with digits",
         lambda t: _validate(_with("diffusion", **{"data.tfds_data_dir": "/data"})),
         Raises(CE, "data.tfds_data_dir='/data' is not read by data.source='digits'")),
    Case("config", "data.path matching nothing",
         lambda t: _validate(_with(**{"data.source": "text", "data.path": str(t / "*.md")})),
         Raises(CE, "matches no file")),
    Case("config", "data.path naming a folder",
         lambda t: _validate(_with(**{"data.source": "text", "data.path": str(t)})),
         Raises(CE, "is a folder; give a file or a glob")),
    Case("config", "unknown data.encoding",
         lambda t: _validate(_with(**{"data.source": "text", "data.path": _text(t),
                                      "data.encoding": "utf-9"})),
         Raises(CE, "data.encoding 'utf-9' is not an encoding Python knows")),
    Case("config", "unknown data.encoding_errors",
         lambda t: _validate(_with(**{"data.source": "text", "data.path": _text(t),
                                      "data.encoding_errors": "lenient"})),
         Raises(CE, "data.encoding_errors 'lenient' is unknown")),
    Case("config", "text without data.path", lambda t: _validate(_with(**{"data.source": "text"})),
         Raises(CE, "data.source='text' needs data.path")),
    Case("config", "tfds without data.tfds_name",
         lambda t: _validate(_with(**{"data.source": "tfds"})),
         Raises(CE, "data.source='tfds' needs data.tfds_name")),
    Case("config", "unknown data.source", lambda t: _validate(_with(**{"data.source": "hf"})),
         Raises(CE, "data.source 'hf' is unknown")),
    Case("config", "missing SentencePiece file",
         lambda t: _validate(_with(**{"data.tokenizer": str(t / "spiece.model")})),
         Raises(CE, "is neither 'byte' nor an existing SentencePiece .model file")),
    Case("config", "a SentencePiece path that is not a model",
         lambda t: _validate(_with(**{"data.tokenizer": _file(t, "spiece.model", b"not a model")})),
         Raises(CE, "is not a SentencePiece model file (")),
    Case("config", "data.cache_dir naming a file",
         lambda t: _validate(_with(**{"data.cache_dir": _file(t, "cache", b"x")})),
         Raises(CE, "is a file; give a folder for the token cache")),
    Case("config", "a text corpus with its own keys validates",
         lambda t: _validate(_with(**{"data.source": "text", "data.path": _text(t),
                                      "data.encoding": "latin-1",
                                      "data.encoding_errors": "replace"})) is not None,
         Holds("no problem reported")),

    # data: decoding, files and sizes (lpjax.data, and the Trainer's checks before compiling)
    Case("data", "Latin-1 corpus", lambda t: _text_tokens(t, LATIN1),
         Raises(ValueError, "doc.txt is not valid utf-8: invalid continuation byte at byte "
                            "offset 9")),
    Case("data", "binary file", lambda t: _text_tokens(t, BINARY),
         Raises(ValueError, "is not valid utf-8: invalid start byte at byte offset 0")),
    Case("data", "data.encoding='latin-1' reads it as meant",
         lambda t: _text_tokens(t, LATIN1, encoding="latin-1") == _utf8_tokens(
             "hello caf\u00e9 world\n"), Holds("the tokens of the text the bytes encode")),
    Case("data", "encoding_errors='replace' replaces",
         lambda t: _text_tokens(t, LATIN1, errors="replace") == _utf8_tokens(
             "hello caf\ufffd world\n"), Holds("U+FFFD where the byte was")),
    Case("data", "UTF-16 corpus with data.encoding='utf-16'",
         lambda t: _text_tokens(t, "na\u00efve\n".encode("utf-16"), encoding="utf-16")
         == _utf8_tokens("na\u00efve\n"), Holds("decoded, BOM and all")),
    Case("data", "a replace-decoded cache is not reused by a strict read", _replace_then_strict,
         Holds("the strict read still names the byte")),
    Case("data", "a folder as the corpus",
         lambda t: lpdata.text_dataset(str(t), "byte", cache_root=str(t / "cache")),
         Raises(FileNotFoundError, "is a folder; give a file or a glob")),
    Case("data", "a glob that matches nothing",
         lambda t: lpdata.text_dataset(str(t / "*.txt"), "byte", cache_root=str(t)),
         Raises(FileNotFoundError, "No text files match")),
    Case("data", "eval split shorter than one sequence, before the Trainer builds anything",
         _trainer_too_small_eval, Raises(DE, "The evaluation split of")),
    Case("data", "train split shorter than one sequence",
         lambda t: preflight.check_dataset(_with(), lpdata.TokenStreamDataset(
             np.zeros(20, np.uint16), np.zeros(500, np.uint16), vocab_size=257, name="tiny")),
         Raises(DE, "The training split of tiny has 20 tokens, fewer than the 34 one sequence "
                    "of length 32 needs")),
    Case("data", "a TFDS stream without evaluation documents",
         lambda t: preflight.check_dataset(_with(), type("Stream", (), dict(
             name="wiki", num_eval_examples=0, eval_split="validation"))()),
         Raises(DE, "TFDS dataset wiki has no evaluation documents (split 'validation')")),
    Case("data", "a train split one token short of a sequence",
         lambda t: preflight.check_dataset(
             override(_with(), seq_len=16), lpdata.TokenStreamDataset(
                 np.zeros(17, np.uint16), np.zeros(500, np.uint16), vocab_size=257, name="short")),
         Raises(DE, "has 17 tokens, fewer than the 18 one sequence of length 16 needs")),
    Case("data", "a split exactly one sequence long is enough", lambda t: _boundary_split(),
         Holds("no error at the boundary, and both batches can be drawn")),
    Case("data", "a missing file inside lpjax.data becomes a DataError", _data_errors_convert,
         Raises(DE, "No text files match")),
    Case("data", "a token cache that cannot be a folder", _cache_under_a_file,
         Raises(DE, "Not a directory. Check data.path (the corpus) and data.cache_dir")),
    Case("data", "an unprepared TFDS dataset becomes a DataError with the command", _unprepared_tfds,
         Raises(DE, "tfds build c4/en --file_format=array_record")),
    Case("data", "an error raised elsewhere is not relabelled", _data_errors_pass_through,
         Holds("a ValueError outside lpjax.data stays a ValueError")),

    # workdirs (lpjax.train._preflight.prepare_workdir, the Trainer's first step)
    Case("workdir", "a file", lambda t: preflight.prepare_workdir(_file(t, "f", b"x")),
         Raises(WE, "is a file, not a folder")),
    Case("workdir", "under a file",
         lambda t: preflight.prepare_workdir(os.path.join(_file(t, "f", b"x"), "run", "1")),
         Raises(WE, "which is a file, not a folder")),
    Case("workdir", "a new nested folder is created",
         lambda t: os.path.isdir(preflight.prepare_workdir(str(t / "a" / "b" / "c"))),
         Holds("created")),
    Case("workdir", "an existing folder keeps its files",
         lambda t: (_file(t, "keep.txt", b"x") and preflight.prepare_workdir(str(t))
                    and sorted(os.listdir(t)) == ["keep.txt"]), Holds("no probe file left")),

    # library calls: zero-size operands and non-finite tensor_amax (lpjax.quant)
    Case("library", "Hadamard of (0, 32)",
         lambda t: quant.hadamard(jnp.zeros((0, 32)), 16).shape == (0, 32), Holds("shape kept")),
    Case("library", "Hadamard of (4, 0), inverse",
         lambda t: quant.hadamard(jnp.zeros((4, 0)), 16, inverse=True).shape == (4, 0),
         Holds("shape kept")),
    Case("library", "SSP FP4 of (0, 256)",
         lambda t: quant.ssp_fake_quant(jnp.zeros((0, 256)), "ssp_fp4_g256").shape == (0, 256),
         Holds("shape kept")),
    Case("library", "SSP uint4 of (3, 0)",
         lambda t: quant.ssp_fake_quant(jnp.zeros((3, 0)), "ssp_uint4_g256").shape == (3, 0),
         Holds("shape kept")),
    Case("library", "quartet GEMM with no rows", lambda t: _gemm_empty("quartet", (0, 64), (64, 32)),
         Holds("lax's shape, finite gradients")),
    Case("library", "nvfp4 GEMM with no columns", lambda t: _gemm_empty("nvfp4", (8, 64), (64, 0)),
         Holds("lax's shape, finite gradients")),
    Case("library", "mxfp4_bwd GEMM with an empty batch axis",
         lambda t: _gemm_empty("mxfp4_bwd", (2, 0, 64), (64, 32)), Holds("lax's shape")),
    Case("library", "ssp_fp4 GEMM with no rows", lambda t: _gemm_empty("ssp_fp4", (0, 64), (64, 32)),
         Holds("lax's shape")),
    Case("library", "quartet GEMM with an empty contraction",
         lambda t: _gemm_empty("quartet", (8, 0), (0, 32)), Holds("zeros, as lax gives")),
    Case("library", "quartet conv of an empty batch",
         lambda t: jax.jit(lambda x, w: quant.conv_general_dilated(
             x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), recipe="quartet",
             key=KEY))(jnp.ones((0, 8, 8, 32)), jnp.ones((3, 3, 32, 16))).shape == (0, 8, 8, 16),
         Holds("shape kept")),
    Case("library", "nvfp4 einsum of an empty batch",
         lambda t: jax.jit(lambda x, w: quant.einsum("bsd,df->bsf", x, w, recipe="nvfp4", key=KEY))(
             jnp.ones((0, 4, 64)), jnp.ones((64, 32))).shape == (0, 4, 32), Holds("shape kept")),
    Case("library", "every format quantizes zero-size arrays",
         lambda t: _every_format_takes_empty_arrays(), Holds("shapes kept")),
    Case("library", "tensor_amax=inf", lambda t: _nan_tensor_amax(float("inf")),
         Holds("every block NaN: scale 0x7F, codes 0")),
    Case("library", "tensor_amax=nan", lambda t: _nan_tensor_amax(float("nan")),
         Holds("every block NaN: scale 0x7F, codes 0")),
    Case("library", "tensor_amax=inf through the Pallas kernels",
         lambda t: _pallas_agrees_on_a_nan_tensor_amax(), Holds("the XLA path's bits")),
    Case("library", "a finite tensor_amax equal to max|x|",
         lambda t: _finite_tensor_amax_is_the_measured_one(), Holds("the measured amax's bits")),

    # optimizers: what the trainer rejects, the library rejects; huge finite gradients
    Case("optim", "stable_spam negative lr", lambda t: optim.stable_spam(-1e-3),
         Raises(ValueError, "learning_rate must be a finite number >= 0, got -0.001")),
    Case("optim", "spam negative lr", lambda t: optim.spam(-1.0),
         Raises(ValueError, "spam: learning_rate must be a finite number >= 0")),
    Case("optim", "stable_spam NaN lr", lambda t: optim.stable_spam(float("nan")),
         Raises(ValueError, "learning_rate must be a finite number >= 0, got nan")),
    Case("optim", "stable_spam negative weight decay",
         lambda t: optim.stable_spam(1e-3, weight_decay=-0.1),
         Raises(ValueError, "weight_decay must be a finite number >= 0")),
    Case("optim", "spam infinite weight decay",
         lambda t: optim.spam(1e-3, weight_decay=float("inf")),
         Raises(ValueError, "weight_decay must be a finite number >= 0, got inf")),
    Case("optim", "stable_spam eps of 0", lambda t: optim.stable_spam(1e-3, eps=0.0),
         Raises(ValueError, "eps must be a finite number > 0")),
    Case("optim", "stable_spam eta_min above 1", lambda t: optim.stable_spam(1e-3, eta_min=1.5),
         Raises(ValueError, r"eta_min must be in [0, 1]")),
    Case("optim", "stable_spam NaN gamma3", lambda t: optim.stable_spam(1e-3, gamma3=float("nan")),
         Raises(ValueError, "gamma3 must be in [0, 1)")),
    Case("optim", "spam negative spike threshold",
         lambda t: optim.spam(1e-3, spike_threshold=-1.0),
         Raises(ValueError, "spike_threshold must be a finite number >= 0")),
    Case("optim", "spam negative clip-free steps", lambda t: optim.spam(1e-3, clip_free_steps=-1),
         Raises(ValueError, "clip_free_steps must be a finite number >= 0")),
    Case("optim", "decay_updated_weights negative decay",
         lambda t: optim.decay_updated_weights(-0.1, 1e-3),
         Raises(ValueError, "weight_decay must be a finite number >= 0")),
    Case("optim", "a learning-rate schedule is accepted",
         lambda t: optim.stable_spam(optax.linear_schedule(0.0, 1e-3, 10)) is not None,
         Holds("schedules are not checked")),
    Case("optim", "stable_spam first step of a 1e30 gradient",
         lambda t: _huge_first_step_is_scale_free(1e30), Holds("= the step of the gradient / 2^100")),
    Case("optim", "stable_spam first step of a 3e38 gradient (its norm overflows float32)",
         lambda t: _huge_first_step_is_scale_free(3e38), Holds("= the step of the gradient / 2^100")),
    Case("optim", "stable_spam through 1e20 spikes",
         lambda t: _keeps_training_after_a_spike(lambda: optim.stable_spam(1e-3), 1e20),
         Holds("finite params and state, still training")),
    Case("optim", "stable_spam through FLT_MAX spikes",
         lambda t: _keeps_training_after_a_spike(lambda: optim.stable_spam(1e-3, reset_interval=20),
                                                 float(np.finfo(np.float32).max)),
         Holds("finite params and state, still training")),
    Case("optim", "spam through 1e30 spikes (inside and after the clip-free steps)",
         lambda t: _keeps_training_after_a_spike(lambda: optim.spam(1e-3), 1e30),
         Holds("finite params and state, still training")),
    Case("optim", "spam through FLT_MAX spikes after a reset",
         lambda t: _keeps_training_after_a_spike(lambda: optim.spam(1e-3, reset_interval=10),
                                                 float(np.finfo(np.float32).max), (12, 31)),
         Holds("finite params and state, still training")),
    Case("optim", "the scaled norm of huge values",
         lambda t: _scaled_norm_matches_float64([3e30, -4e30, 1.0]),
         Holds("the float64 norm, and the unit vector")),
    Case("optim", "the scaled norm beyond FLT_MAX",
         lambda t: _scaled_norm_matches_float64([3e38] * 4), Holds("inf, with a finite unit vector")),
    Case("optim", "the scaled norm of tiny values",
         lambda t: _scaled_norm_matches_float64([3e-30, 4e-30]), Holds("no underflow to 0")),
    Case("optim", "the scaled norm in the normal range",
         lambda t: _scaled_norm_is_the_plain_norm_bit_for_bit(), Holds("the plain norm's bits")),
]

# Cases that need pytest fixtures besides tmp_path.
FIXTURE_CASES = [
    Case("workdir", "unwritable (mkstemp refused)", _unwritable_workdir,
         Raises(WE, "cannot be written (Permission denied")),
    Case("workdir", "'~' is expanded", _home_workdir, Holds("under $HOME")),
    Case("data", "tensorflow_datasets not installed", _tfds_not_installed,
         Raises(DE, "pip install tensorflow-datasets array-record")),
    Case("data", "the log names a text corpus and its size in tokens",
         lambda t, caplog: _check_dataset_logs(t, caplog, lpdata.TokenStreamDataset(
             np.zeros(5000, np.uint16), np.zeros(300, np.uint16), vocab_size=257, name="corpus"),
             _with(), ["Data: corpus", "5,000 training and 300 evaluation tokens"]),
         Holds("logged")),
    Case("data", "the log names an image dataset and its size",
         lambda t, caplog: _check_dataset_logs(t, caplog, lpdata.digits_dataset(),
                                               _with("classification"),
                                               ["Data: digits", "training and 360 evaluation "
                                                                "images"]),
         Holds("logged")),
]


def _check(case, call):
  if isinstance(case.expect, Raises):
    with pytest.raises(case.expect.error) as info:
      call()
    assert case.expect.match in str(info.value), str(info.value)
  else:
    assert call() is True, case.expect.what


@pytest.mark.parametrize("case", CASES, ids=[f"{c.group}: {c.name}" for c in CASES])
def test_bad_input(case, tmp_path):
  _check(case, lambda: case.run(tmp_path))


@pytest.mark.parametrize("case", FIXTURE_CASES, ids=[f"{c.group}: {c.name}" for c in FIXTURE_CASES])
def test_bad_input_with_fixtures(case, tmp_path, monkeypatch, caplog):
  import inspect
  extra = {"monkeypatch": monkeypatch, "caplog": caplog}
  names = list(inspect.signature(case.run).parameters)[1:]
  _check(case, lambda: case.run(tmp_path, *(extra[n] for n in names)))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only folders")
def test_a_read_only_workdir(tmp_path):
  os.chmod(tmp_path, 0o500)
  try:
    with pytest.raises(preflight.WorkdirError, match="cannot be written"):
      preflight.prepare_workdir(str(tmp_path / "run"))
  finally:
    os.chmod(tmp_path, 0o700)


# --- train.py itself: exit status 2, one message, no traceback, nothing compiled ---------------

TRAIN_PY_CASES = [  # (name, extra args or NAME=value environment, expected message substring)
    ("unknown key with a hint", ["--config.optimizer.lrr=2e-3"],
     "Config error: Unknown config key(s): optimizer.lrr (did you mean optimizer.lr?)"),
    ("another task's section", ["--config.diffusion.timesteps=5"],
     "Config error: diffusion.timesteps applies to task 'diffusion' only"),
    ("a float for an int", ["--config.steps=1.5"],
     "Flag error: --config.steps must be an int"),
    ("unknown flag", ["--workdirr=x"], "Flag error: Unknown command line flag 'workdirr'. Did you "
                                       "mean: workdir ?"),
    ("no such config file", ["--config=configs/no_such_config.py"],
     "Flag error: --config=configs/no_such_config.py: no such file"),
    ("Latin-1 corpus", ["--config.data.source=text", "--config.data.path={latin1}",
                        "--config.data.cache_dir={tmp}/cache"],
     "Data error: {latin1} is not valid utf-8: invalid continuation byte at byte offset 9"),
    ("workdir is a file", ["--workdir={tmp}/a_file"],
     "Workdir error: The workdir '{tmp}/a_file' is a file, not a folder"),
    ("JAX_PLATFORMS names a backend that is not installed", ["JAX_PLATFORMS=tpu"],
     "Environment error: JAX cannot start a backend for JAX_PLATFORMS='tpu'"),
]


@pytest.fixture(scope="module")
def train_py_runs(tmp_path_factory):
  """Runs every TRAIN_PY_CASES command at once; {name: (returncode, stderr + stdout, workdir)}."""
  tmp = tmp_path_factory.mktemp("train_py")
  (tmp / "latin1.txt").write_bytes(LATIN1 * 400)
  (tmp / "a_file").write_text("not a folder")
  names = {"tmp": str(tmp), "latin1": str(tmp / "latin1.txt")}
  procs = {}
  for i, (name, args, _) in enumerate(TRAIN_PY_CASES):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.update(a.split("=", 1) for a in args if not a.startswith("-"))
    args = [a for a in args if a.startswith("-")]
    workdir = str(tmp / f"run{i}")
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), f"--workdir={workdir}",
           "--compilation_cache="]
    if not any(a.startswith("--config=") for a in args):
      cmd.append("--config=" + os.path.join(ROOT, "configs", "llama_tiny_mxfp4.py"))
    cmd += [a.format(**names) for a in args]
    procs[name] = (subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, env=env), workdir)
  runs = {}
  for name, (proc, workdir) in procs.items():
    output, _ = proc.communicate(timeout=300)
    runs[name] = (proc.returncode, output, workdir)
  return runs, names


@pytest.mark.parametrize("name,args,message", TRAIN_PY_CASES, ids=[c[0] for c in TRAIN_PY_CASES])
def test_train_py_exits_2_with_one_message(train_py_runs, name, args, message):
  runs, names = train_py_runs
  returncode, output, workdir = runs[name]
  assert returncode == 2, output[-3000:]
  assert "Traceback" not in output, output[-3000:]
  assert message.format(**names) in output, output[-3000:]
  errors = [line for line in output.splitlines() if " error: " in line and not line[:1].isdigit()]
  assert len(errors) == 1, errors  # one message
  assert "Compiling the train step" not in output  # found before compiling
  assert not os.path.exists(os.path.join(workdir, "checkpoints"))
