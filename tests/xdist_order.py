"""Slowest files first under `pytest -n 2 --dist loadfile` (tests/conftest.py registers it).

pytest-xdist's file scheduler hands out files in order of their number of tests, most first, so a
slow file with few tests (a train.py run that is killed and resumed, a notebook, a U-Net run)
starts last and runs alone at the end while the other worker idles. `SLOW_FILES` lists the files
whose wall time in a cold run on 2 cores is a minute or more (pytest's `--durations` of the CI
run), slowest first; `SlowFirstFileScheduling` starts them before every other file, which keeps
its order. tests/test_xdist_order.py checks that every listed file exists.
"""

from __future__ import annotations

# Cold `make test` on 2 cores, the files' summed test times (pytest --durations), slowest first.
# A file of one or two slow tests (train.py runs, a notebook, the GPU check's dry run) belongs here
# even below a minute: loadfile would otherwise start it last.
SLOW_FILES = (
    "tests/train/monitor/test_trainer_monitor.py",
    "tests/train/tasks/test_vision_tasks.py",
    "tests/test_notebooks.py",
    "tests/reliability/test_monitor_kill.py",
    "tests/train/model/test_user_model.py",
    "tests/reliability/test_kill_and_resume.py",
    "tests/reliability/test_stock_environment.py",
    "tests/train/monitor/test_trainer_monitor_llama.py",
    "tests/quant/test_monitor_compiles.py",
    "tests/train/step/test_sharding.py",
    "tests/reliability/test_monitor_cases_loops.py",
    "tests/quant/test_monitor_advisor.py",
    "tests/quant/test_monitor.py",
    "tests/reliability/test_nonfinite.py",
    "tests/test_advise.py",
    "tests/train/loop/test_train.py",
    "tests/train/loop/test_multiprocess.py",
    "tests/train/model/test_hf_checkpoints.py",
    "tests/train/step/test_gqa_sharding.py",
    "tests/reliability/test_rule_cases.py",
    "tests/benchmarks/sweeps/test_ablate.py",
    "tests/train/loop/test_examples.py",
    "tests/benchmarks/studies/test_operand_telemetry.py",
)


def order(scopes):
  """`scopes` (file node ids, in the scheduler's order) with `SLOW_FILES` first, slowest first.

  >>> order(["tests/a.py", "tests/test_notebooks.py", "tests/b.py", "tests/train/tasks/test_vision_tasks.py"])
  ['tests/train/tasks/test_vision_tasks.py', 'tests/test_notebooks.py', 'tests/a.py', 'tests/b.py']
  """
  rank = {name: i for i, name in enumerate(SLOW_FILES)}
  indexed = list(enumerate(scopes))
  indexed.sort(key=lambda item: (rank.get(item[1], len(rank)), item[0]))
  return [scope for _, scope in indexed]


def make_scheduler(base):
  """A subclass of xdist's `LoadFileScheduling` (`base`) that reorders its queue by `order`."""

  class SlowFirstFileScheduling(base):
    _reordered = False

    def _assign_work_unit(self, node):
      if not self._reordered:  # the first assignment: the queue is complete, nothing sent yet
        self._reordered = True
        units = dict(self.workqueue)
        self.workqueue.clear()
        for scope in order(list(units)):
          self.workqueue[scope] = units[scope]
      super()._assign_work_unit(node)

  return SlowFirstFileScheduling
