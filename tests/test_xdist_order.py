"""tests/xdist_order.py: the slow-first file order of `make test` names real files and keeps order."""

import os

import pytest

import xdist_order

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", xdist_order.SLOW_FILES)
def test_every_slow_file_exists(name):
  assert os.path.isfile(os.path.join(ROOT, name)), (
      f"{name} is listed in tests/xdist_order.py SLOW_FILES but does not exist: update the list")


def test_slow_files_come_first_and_the_rest_keep_their_order():
  rest = ["tests/quant/test_a.py", "tests/b.py", "tests/c.py"]
  scopes = [rest[0], xdist_order.SLOW_FILES[2], rest[1], xdist_order.SLOW_FILES[0], rest[2]]
  assert xdist_order.order(scopes) == [xdist_order.SLOW_FILES[0], xdist_order.SLOW_FILES[2], *rest]


def test_the_scheduler_hands_out_the_slowest_file_first():
  xdist = pytest.importorskip("xdist.scheduler")

  class Recording(xdist.LoadFileScheduling):
    def __init__(self):  # no config: only the queue and the assignment are exercised
      self.workqueue = {"tests/b.py": {"tests/b.py::t1": False, "tests/b.py::t2": False},
                        xdist_order.SLOW_FILES[1]: {xdist_order.SLOW_FILES[1] + "::t": False}}
      self.sent = []

    def _assign_work_unit(self, node):
      scope = next(iter(self.workqueue))
      self.sent.append(scope)
      del self.workqueue[scope]

  scheduler = xdist_order.make_scheduler(Recording)()
  scheduler._assign_work_unit(None)
  scheduler._assign_work_unit(None)
  assert scheduler.sent == [xdist_order.SLOW_FILES[1], "tests/b.py"]
