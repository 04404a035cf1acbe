"""Checks of the workdir and the loaded data, before anything compiles (docs/reliability.md).

`validate` checks the config alone; these check what it names: the workdir can be created and
written (`prepare_workdir`), the data source loads (`data_errors` turns a failure of lpjax.data,
a missing file, a file that is not UTF-8, an unprepared TFDS dataset, a missing package, into a
`DataError` with its message), and the dataset is big enough for one training and one evaluation
batch (`check_dataset`, which also logs its name and size). Each raises a ConfigError subclass,
which train.py prints as one line, with exit status 2.

Examples:
  >>> import tempfile, os
  >>> d = tempfile.mkdtemp()
  >>> open(os.path.join(d, "file"), "w").close()
  >>> try:
  ...   prepare_workdir(os.path.join(d, "file", "run"))
  ... except WorkdirError as e:
  ...   print(str(e).split(";")[0].replace(d, "D"))
  The workdir 'D/file/run' is under 'D/file', which is a file, not a folder
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile

from lpjax.train.schema._config_schema import ConfigError

log = logging.getLogger("lpjax.train")


class WorkdirError(ConfigError):
  """The workdir cannot be created or written; the message says why and what to do."""


class DataError(ConfigError):
  """The configured data cannot be read or is too small; the message says how to fix it."""


class EnvironmentProblem(ConfigError):
  """This machine cannot run the configured job as it is set up (e.g. JAX_PLATFORMS names a
  backend that is not installed); the message says what to change."""


def devices():
  """jax.devices(), or an EnvironmentProblem naming JAX_PLATFORMS when its backend cannot start
  (jax raises a RuntimeError, or for some platforms a bare AssertionError, with a traceback)."""
  import jax

  try:
    return jax.devices()
  except (RuntimeError, AssertionError) as e:
    platforms = os.environ.get("JAX_PLATFORMS", "")
    detail = str(e).split("\n")[0] or type(e).__name__
    raise EnvironmentProblem(
        f"JAX cannot start a backend for JAX_PLATFORMS={platforms!r} ({detail}). Unset "
        "JAX_PLATFORMS (JAX then picks what is installed) or set it to 'cpu', or install the jax "
        "build for this accelerator (e.g. pip install -U 'jax[cuda12]').") from e


def _first_existing_parent(path: str) -> str:
  while not os.path.lexists(path):
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  return path


def prepare_workdir(workdir: str) -> str:
  """Creates `workdir` (absolute) and checks that it is a writable folder; raises WorkdirError."""
  workdir = os.path.abspath(os.path.expanduser(workdir))
  fix = "pass another --workdir (a folder path that can be created and written)"
  if os.path.lexists(workdir) and not os.path.isdir(workdir):
    raise WorkdirError(f"The workdir {workdir!r} is a file, not a folder; {fix}.")
  existing = _first_existing_parent(workdir)
  if existing != workdir and not os.path.isdir(existing):
    raise WorkdirError(f"The workdir {workdir!r} is under {existing!r}, which is a file, not a "
                       f"folder; {fix}.")
  try:
    os.makedirs(workdir, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=workdir, prefix=".write-check-")
    os.close(fd)
    os.remove(probe)
  except OSError as e:
    reason = e.strerror or type(e).__name__
    raise WorkdirError(f"The workdir {workdir!r} cannot be written ({reason}: {existing!r} is "
                       f"read-only or not yours); {fix}, or make it writable.") from e
  return workdir


def _raised_in_data(error: BaseException) -> bool:
  """Whether `error` was raised while lpjax.data code ran (not by the model or the trainer)."""
  data_dir = os.path.join("lpjax", "data") + os.sep
  tb = error.__traceback__
  while tb is not None:
    if data_dir in tb.tb_frame.f_code.co_filename:
      return True
    tb = tb.tb_next
  return False


@contextlib.contextmanager
def data_errors():
  """Turns an error raised by lpjax.data (a file, a dataset, a package) into a DataError."""
  try:
    yield
  except (OSError, ValueError, ImportError) as e:
    if isinstance(e, ConfigError) or not _raised_in_data(e):
      raise
    message = str(e)
    if isinstance(e, ImportError) and "pip install" not in message:
      message += f". Install the missing package ({e.name or 'see the message'}) with pip."
    elif isinstance(e, OSError) and e.filename and not message.startswith(("No ", "TFDS", "data.")):
      # an operating-system error on a data file or the token cache, not one of lpjax's messages
      message = (f"Cannot use {e.filename!r} for the data: {e.strerror or message}. Check "
                 "data.path (the corpus) and data.cache_dir or $LPJAX_CACHE_DIR (the token cache, "
                 "a folder that can be written)")
    raise DataError(f"{message} (check the config's data.* keys)" if "data." not in message
                    else message) from e


def _max_seq_len(config) -> int:
  from lpjax.train.schema._validate import parse_schedule

  lengths = [length for length, _ in parse_schedule(config.data.seq_len_schedule)]
  return max([config.seq_len, *lengths])


def check_dataset(config, dataset) -> str:
  """Raises DataError when `dataset` cannot give one training and one evaluation batch of
  `config`; returns (and logs) one line naming the dataset and its size."""
  if config.task == "lm":
    summary = _text_summary(config, dataset)
  else:
    summary = (f"{dataset.name}: {dataset.train_size:,} training and {dataset.eval_size:,} "
               "evaluation images")
  log.info("Data: %s.", summary)
  return summary


def _text_summary(config, dataset) -> str:
  train, evaluation = getattr(dataset, "train_tokens", None), getattr(dataset, "eval_tokens", None)
  if train is None:  # a TFDS stream: documents, with tokens estimated when it is array_record
    return _tfds_summary(dataset)
  need_train, need_eval = _max_seq_len(config) + 2, config.seq_len + 2
  fixes = ("use more text (data.path), a shorter seq_len (or data.seq_len_schedule), or another "
           "data.source")
  # (seq_len + 2: a window of seq_len + 1 tokens, inputs and shifted targets, at a random start)
  if len(train) < need_train:
    raise DataError(f"The training split of {dataset.name} has {len(train):,} tokens, fewer than "
                    f"the {need_train:,} one sequence of length {need_train - 2:,} needs; {fixes}.")
  if len(evaluation) < need_eval:
    raise DataError(f"The evaluation split of {dataset.name} has {len(evaluation):,} tokens, "
                    f"fewer than the {need_eval:,} one sequence of length {config.seq_len:,} "
                    f"needs, so the first evaluation would fail after training; {fixes}.")
  return (f"{dataset.name}: {len(train):,} training and {len(evaluation):,} evaluation tokens "
          f"(vocabulary {dataset.vocab_size:,})")


_SAMPLE_DOCUMENTS = 16


def _tfds_summary(dataset) -> str:
  train, evaluation = getattr(dataset, "train_source", None), getattr(dataset, "eval_source", None)
  if train is None:  # the tf.data reader: no random access, so no token count without a full pass
    documents = getattr(dataset, "num_eval_examples", None)
    if documents == 0:
      raise DataError(f"TFDS dataset {dataset.name} has no evaluation documents (split "
                      f"{getattr(dataset, 'eval_split', 'validation')!r}), so the first evaluation "
                      "would fail after training. Prepare that split or choose another "
                      "data.tfds_name.")
    return (f"{dataset.name} through tf.data: {documents or 0:,} evaluation documents (tokens not "
            "counted: the stream is read in order)")
  if len(train) == 0 or len(evaluation) == 0:
    raise DataError(f"TFDS dataset {dataset.name} has {len(train)} training and {len(evaluation)} "
                    "evaluation documents; both splits need at least one. Prepare the dataset "
                    "again or choose another data.tfds_name.")
  sample = min(len(train), _SAMPLE_DOCUMENTS)
  tokens = sum(len(dataset._document(train, i)) for i in range(sample))  # noqa: SLF001
  estimate = tokens * len(train) // sample
  return (f"{dataset.name}: {len(train):,} training documents (about {estimate:,} tokens, from the "
          f"first {sample}) and {len(evaluation):,} evaluation documents")
