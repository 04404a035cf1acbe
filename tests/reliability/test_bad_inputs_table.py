"""The bad-input table (issue 40): flags, config values, data files and workdirs.

Each case is one row with its expected outcome: an exception type and a message substring (the
trainer's errors are ConfigError subclasses, which train.py prints as one line with exit status
2), or a property of the result. The rows call the functions train.py runs, in-process
(train.py's `_parse_flags` runs `lpjax.train.cli._cli`, the Trainer runs `lpjax.train.schema._preflight`), so
the table costs seconds. Library and optimizer rows: test_bad_inputs_library.py; train.py itself:
test_bad_inputs_train_py.py.
"""

from __future__ import annotations

import logging
import os
import sys

import numpy as np
import pytest
from absl import flags

from bad_input_cases import Case, Holds, Raises, check
from config_helpers import override, small

from lpjax import data as lpdata
from lpjax.train import ConfigError, validate
from lpjax.train.cli import _cli as cli
from lpjax.train.schema import _preflight as preflight

LATIN1 = b"hello caf\xe9 world\n"  # 'caf\xe9' is Latin-1; byte 9 is not UTF-8 there
BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xd8\xff"


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
  from lpjax.train.cli._vision_configs import vision_config
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


# --- the table ----------------------------------------------------------------------------------

CE, DE, WE = ConfigError, preflight.DataError, preflight.WorkdirError

CASES = [
    # flags: train.py's path for --config.x=y (lpjax.train.cli._cli, then validate)
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

    # workdirs (lpjax.train.schema._preflight.prepare_workdir, the Trainer's first step)
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


@pytest.mark.parametrize("case", CASES, ids=[f"{c.group}: {c.name}" for c in CASES])
def test_bad_input(case, tmp_path):
  check(case, lambda: case.run(tmp_path))


@pytest.mark.parametrize("case", FIXTURE_CASES, ids=[f"{c.group}: {c.name}" for c in FIXTURE_CASES])
def test_bad_input_with_fixtures(case, tmp_path, monkeypatch, caplog):
  import inspect
  extra = {"monkeypatch": monkeypatch, "caplog": caplog}
  names = list(inspect.signature(case.run).parameters)[1:]
  check(case, lambda: case.run(tmp_path, *(extra[n] for n in names)))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only folders")
def test_a_read_only_workdir(tmp_path):
  os.chmod(tmp_path, 0o500)
  try:
    with pytest.raises(preflight.WorkdirError, match="cannot be written"):
      preflight.prepare_workdir(str(tmp_path / "run"))
  finally:
    os.chmod(tmp_path, 0o700)
