"""The bad-input table (issue 40), train.py itself: each bad flag, file or environment exits with
status 2 and one message, with no traceback and before anything compiles.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LATIN1 = b"hello caf\xe9 world\n"  # 'caf\xe9' is Latin-1; byte 9 is not UTF-8 there


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
    ("config is a folder", ["--config={root}/configs/"],
     "Config error: --config={root}/configs/ is a folder; give one config file in it ("),
    ("config is not a Python file", ["--config={root}/README.md"],
     "Config error: --config={root}/README.md is not a Python config file"),
    ("config with a syntax error", ["--config={tmp}/broken.py"],
     "Config error: --config={tmp}/broken.py could not be loaded (line 2): SyntaxError"),
    ("unknown recipe with a hint", ["--config.quant.recipe=mxfp5"],
     "Config error: quant.recipe 'mxfp5' is unknown (did you mean 'mxfp8' or 'mxfp4'?)"),
    ("QuantPolicy's name for a config key", ["--config.quant.keep_first_blocks=2"],
     "the config key is quant.keep_first"),
]


@pytest.fixture(scope="module")
def train_py_runs(tmp_path_factory):
  """Runs every TRAIN_PY_CASES command at once; {name: (returncode, stderr + stdout, workdir)}."""
  tmp = tmp_path_factory.mktemp("train_py")
  (tmp / "latin1.txt").write_bytes(LATIN1 * 400)
  (tmp / "a_file").write_text("not a folder")
  (tmp / "broken.py").write_text("def get_config():\n  return {\n")
  names = {"tmp": str(tmp), "latin1": str(tmp / "latin1.txt"), "root": ROOT}
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
  # no private source file as the place to look (lpjax/train/_x.py or lpjax/train/<part>/_x.py)
  assert not re.search(r"lpjax/train/(\w+/)?_", output), output[-3000:]
  assert not os.path.exists(workdir)  # a failed start leaves no (empty) workdir behind
