"""The segments of a run: one per process that trained in the workdir (a run stopped by Ctrl-C,
preemption or a kill and resumed has several), each with its steps, wall time, compile time and
how it ended. They are saved in each checkpoint's meta, so a resumed run adds its own to the
earlier ones and results.json gives the whole run's time, not only the last process's.

A segment is saved as "running" at each checkpoint it writes before its end; a resumed run that
finds "running" in the checkpoint it resumes from knows that segment ended without a checkpoint
of its own end (SIGKILL, a crash, a power loss) and records it as "killed", counted up to that
checkpoint: its steps and time after it are lost, and done again.

Examples:
  >>> s = Segments([{"start_step": 0, "end_step": 160, "wall_s": 420.0, "compile_s": 31.0,
  ...                "ended": "interrupted", "signal": "SIGINT"}], start_step=160, started=0.0)
  >>> totals = s.results(300, compile_s=2.0, now=270.0)
  >>> totals["wall_time_s"], totals["compile_time_s"], [g["ended"] for g in totals["segments"]]
  (690.0, 33.0, ['interrupted', 'finished'])
  >>> Segments(s.dump(200, 1.0, now=100.0), 200).previous[-1]["ended"]  # no clean end: killed
  'killed'
"""

from __future__ import annotations

import time

# How a segment ended: the run reached config.steps; a SIGTERM / SIGINT stopped it (the segment's
# "signal" names which); `Trainer.run(stop_after=...)` stopped it; it ended without a checkpoint
# at its end (SIGKILL, a crash), counted up to its last checkpoint. "running": saved mid-segment.
ENDINGS = ("finished", "interrupted", "stopped", "killed")


class Segments:
  """The earlier segments (from the resumed checkpoint's meta) and the current one.

  `saved`: the list the checkpoint holds (None or [] for a fresh run); `start_step`: the step
  this process starts from; `started`: its start time (time.time(); default now). `results`: the
  workdir's results.json, if any: a finished run trained further takes its last segment from
  there, with the final evaluation that came after the checkpoint.
  """

  def __init__(self, saved, start_step: int, started: float | None = None,
               results: dict | None = None):
    self.previous = [dict(s, ended="killed") if s.get("ended") == "running" else dict(s)
                     for s in saved or [] if isinstance(s, dict)]
    final = ((results or {}).get("segments") or [None])[-1]
    if (self.previous and self.previous[-1].get("ended") == "finished" and isinstance(final, dict)
        and (final.get("start_step"), final.get("end_step")) == (
            self.previous[-1].get("start_step"), self.previous[-1].get("end_step"))):
      self.previous[-1] = dict(final)
    self.start_step = int(start_step)
    self.started = time.time() if started is None else started

  def current(self, end_step: int, compile_s: float, ended: str, signal: str | None = None,
              now: float | None = None) -> dict:
    """This process's segment as it stands at `end_step`."""
    now = time.time() if now is None else now
    segment = {"start_step": self.start_step, "end_step": int(end_step),
               "wall_s": round(now - self.started, 2), "compile_s": round(compile_s, 2),
               "ended": ended}
    if signal:
      segment["signal"] = signal
    return segment

  def dump(self, end_step: int, compile_s: float, ended: str = "running",
           signal: str | None = None, now: float | None = None) -> list:
    """Every segment, this one as of `end_step`: what a checkpoint's meta records."""
    return self.previous + [self.current(end_step, compile_s, ended, signal, now)]

  def results(self, end_step: int, compile_s: float, now: float | None = None) -> dict:
    """results.json's timing of a finished run: `wall_time_s` and `compile_time_s` summed over
    the segments, and `segments` (each one's steps, seconds and ending)."""
    segments = self.dump(end_step, compile_s, "finished", now=now)
    return {"wall_time_s": round(sum(float(s.get("wall_s", 0.0)) for s in segments), 2),
            "compile_time_s": round(sum(float(s.get("compile_s", 0.0)) for s in segments), 2),
            "segments": segments}
