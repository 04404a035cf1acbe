"""The trainer's `monitor` section: per-site FP4 numerics while training, alerts, and per-site
fallback (docs/numerics_monitor.md, "In training").

Every `monitor.every`-th step is the measured train step (`Trainer.train_step(policy, sites)`):
the same update, whose forward and backward pass (of the first microbatch with
grad_accum_steps > 1) also measure every quantized site's statistics, through
`lpjax.quant.monitor.site_stats.measured_value_and_grad`, with the step's policy and key, on the
operands the step itself quantizes. The other steps are the plain train step: its compiled HLO is
the same with the monitor on or off. The measured step compiles once per policy and batch shape.

Each measurement appends one JSON line per site and block to <workdir>/monitor.jsonl (`row`),
writes grouped TensorBoard scalars (`monitor/*` summaries, with the counts of sites that did not
run or saw non-finite values, `monitor_snr/<path>`, `monitor_gnr/<path>`: finite readings of the
measured sites only), and logs one line per alert (a statistic across its `monitor.*` threshold;
a site that did not run or saw non-finite values never alerts: `_monitor_rows` has the encodings).
With `monitor.fallback`, a (site, pass) that alerts in `monitor.fallback_after`
measurements in a row switches to `monitor.fallback_recipe` (lpjax/train/monitor/_site_fallback.py).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time

import jax
import jax.numpy as jnp

from lpjax.quant.monitor import observer
from lpjax.quant.monitor.site_stats import discover, measured_value_and_grad
from lpjax.train.monitor import _site_fallback as fallback_lib
from lpjax.train.outputs._metrics import truncate_after
from lpjax.train.monitor._monitor_rows import MEASURED, PASS_OF, alerts, fmt_value, number, row

FILENAME = "monitor.jsonl"
log = logging.getLogger("lpjax.train.monitor")

class Monitor:
  """The monitor of one Trainer; inert when `monitor.every` is 0."""

  def __init__(self, trainer):
    self.trainer = trainer
    self.config = trainer.config.monitor
    self.enabled = self.config.every > 0
    self.base_policy = trainer.precision.policy  # the low phase's, before any switch
    self.switches, self.streaks = [], {}  # [{path, pass, step, ...}], {(path, pass): n}
    self._cache = {}  # (policy, batch shapes) -> {SiteKey: SiteInfo}
    self._file = None
    self.measure_seconds = 0.0  # wall time of the measured steps (their updates included)
    self.measurements = 0

  # --- run lifecycle --------------------------------------------------------------------------

  def start(self, saved: dict, resume_step: int):
    """Restores the switches of a checkpoint's meta and opens monitor.jsonl, dropping the lines
    of steps after `resume_step` (a resumed run measures them again)."""
    self.load(saved)
    if not self.enabled or not self.trainer.is_main:
      return
    path = os.path.join(self.trainer.workdir, FILENAME)
    truncate_after(path, resume_step)
    self._file = open(path, "a", buffering=1)

  def rolled_back(self, saved: dict, step: int):
    """A rollback to the checkpoint of `step`: its switches and streaks come back, and the lines
    of monitor.jsonl after `step` are dropped (those steps are measured again)."""
    self.load(saved)
    if self._file is not None:
      self._file.close()
      path = os.path.join(self.trainer.workdir, FILENAME)
      truncate_after(path, step)
      self._file = open(path, "a", buffering=1)

  def finish(self):
    """Closes monitor.jsonl and writes the heatmap PNG (monitor_heatmap.png)."""
    if self._file is None:
      return
    self._file.close()
    self._file = None
    from lpjax.train.monitor._monitor_heatmap import write_heatmap
    write_heatmap(self.trainer.workdir, min_out_snr_db=self.config.min_out_snr_db,
                  min_grad_noise_ratio=self.config.min_grad_noise_ratio)

  def dump(self) -> dict:
    """The host state a resumed run needs (saved in the checkpoint's meta)."""
    return {"switches": list(self.switches),
            "streaks": [[p, s, n] for (p, s), n in sorted(self.streaks.items())]}

  def load(self, saved: dict):
    saved = saved or {}
    self.switches = [dict(s) for s in saved.get("switches", [])]
    self.streaks = {(p, s): int(n) for p, s, n in saved.get("streaks", [])}
    self.trainer.precision.policy = fallback_lib.with_switches(self.base_policy, self.switches)

  def results(self) -> dict:
    """What results.json records of the monitor (nothing when it is off)."""
    if not self.enabled:
      return {}
    out = {"monitor_measure_time_s": round(self.measure_seconds, 2),
           "monitor_measurements": self.measurements}
    if self.config.fallback:
      out["site_fallbacks"] = list(self.switches)
    return out

  # --- one step -------------------------------------------------------------------------------

  def sites_to_measure(self, step: int, state, batch, key, policy):
    """The sites the train step of `step` measures (when step + 1 is a multiple of
    monitor.every; discovered once per policy and batch shape), or None: a plain step."""
    if not self.enabled or (step + 1) % self.config.every:
      return None
    return self._sites(policy, state, batch, key) or None

  def record(self, step: int, sites: dict, measured, writer, started: float):
    """Writes the rows, scalars and alerts of the measured step `step` (its (loss, stats) output)
    under step + 1, the step whose train/loss metrics.jsonl logs for that batch (the statistics
    are of the parameters before that update); with monitor.fallback, counts the alerts and
    switches sites. `started`: when the measured step was started (its time is counted)."""
    done = step + 1
    loss, stats = jax.device_get(measured)
    rows = []
    for site_key, info in sites.items():
      for b in range(info.rows):
        rows.append(row(done, loss, site_key, b, info, stats[site_key][b]))
    self.measure_seconds += time.perf_counter() - started
    self.measurements += 1
    found = self._report(done, rows, writer)
    if self.config.fallback:
      self._strike(done, sites, found, rows)

  def _sites(self, policy, state, batch, key):
    """{SiteKey: SiteInfo} of the quantized GEMMs of the step's (first micro)batch."""
    shapes = str(jax.tree.map(lambda a: (a.shape, str(a.dtype)), batch))
    cache_key = (policy, shapes)
    if cache_key in self._cache:
      return self._cache[cache_key]
    trainer, k = self.trainer, self.trainer.config.grad_accum_steps
    task = trainer.task

    def call(params, model_state, micro, step_key):
      return task.loss(params, model_state, micro, step_key, policy)[0].astype(jnp.float32)

    def inputs(batch, key, step):  # the train step's first microbatch and its key
      step_key = jax.random.fold_in(key, step)
      if k > 1:
        return jax.tree.map(lambda a: a[::k], batch), jax.random.fold_in(step_key, 0)
      return batch, step_key

    with trainer.activation_hints():
      micro, step_key = jax.eval_shape(inputs, batch, key, state.step)
      sites = discover(call, state.params, state.model_state, micro, step_key)
    log.info("Monitor: %d quantized GEMM sites of recipe %s; measured every %d steps in the "
             "train step itself.", len(sites), policy.recipe, self.config.every)
    self._cache[cache_key] = sites
    return sites

  def _report(self, done, rows, writer) -> list:
    found = []
    snr, gnr = {}, {}
    unmeasured = {"nonfinite": set(), "not_run": set()}
    for r in rows:
      if self._file is not None:
        self._file.write(json.dumps(r, allow_nan=False) + "\n")
      if r["status"] not in MEASURED:
        unmeasured[r["status"]].add(r["path"])
        continue
      # finite readings only: an exact product (inf) has no scalar
      values = [number(r[g]["out_snr_db"]) for g in observer.PASSES
                if len(r[g]) > 1 and r[g]["out_snr_db"] is not None]
      values = [v for v in values if math.isfinite(v)]
      if values:
        snr[r["path"]] = min(values + [snr.get(r["path"], math.inf)])
      ratio = number(r["grad_noise_ratio"])
      if ratio is not None and math.isfinite(ratio) and len(r["wgrad"]) > 1:
        gnr[r["path"]] = min(ratio, gnr.get(r["path"], math.inf))
      for a in alerts(r, self.config) + self._planted(r):
        found.append(dict(a, path=r["path"], block=r["block"]))
        where = r["path"] + ("" if r["block"] is None else f" (block {r['block']})")
        side = "<" if a["key"].startswith("min") else ">"
        log.warning("step %d: monitor alert: %s %s = %s %s monitor.%s = %g", done, where,
                    a["statistic"], fmt_value(a["value"]), side, a["key"], a["threshold"])
    if unmeasured["nonfinite"]:
      log.warning("step %d: monitor: %d site(s) saw a NaN or an infinity in this step's "
                  "operands or products, so they have no statistics (status nonfinite): %s",
                  done, len(unmeasured["nonfinite"]), ", ".join(sorted(unmeasured["nonfinite"])))
    scalars = {"monitor/alerts": len(found), "monitor/site_fallbacks": len(self.switches),
               "monitor/nonfinite_sites": len(unmeasured["nonfinite"]),
               "monitor/not_run_sites": len(unmeasured["not_run"])}
    if snr:
      scalars["monitor/min_out_snr_db"] = min(snr.values())
    if gnr:
      scalars["monitor/min_grad_noise_ratio"] = min(gnr.values())
    scalars.update({f"monitor_snr/{p}": v for p, v in snr.items()})
    scalars.update({f"monitor_gnr/{p}": v for p, v in gnr.items()})
    writer.write(done, scalars)
    return found

  def _planted(self, r) -> list:
    """debug.monitor_fail_path: that path's forward fails (its fwd.out_snr_db, whatever it is)."""
    pattern = self.trainer.config.debug.monitor_fail_path
    if (not pattern or not re.search(pattern, r["path"]) or len(r["fwd"]) < 2
        or r["status"] not in MEASURED):
      return []
    return [dict(statistic="fwd.out_snr_db", value=r["fwd"]["out_snr_db"],
                 key="min_out_snr_db (planted by debug.monitor_fail_path)",
                 threshold=self.config.min_out_snr_db,
                 **{"pass": "fwd"})]

  def _strike(self, done, sites, found, rows):
    """Counts failing measurements in a row per (path, pass); switches those reaching
    monitor.fallback_after (at most monitor.max_fallback_sites in the run). A path none of
    whose rows was measured in this step (it never ran, or saw a NaN or an infinity) keeps its
    streak: neither a failure nor a pass."""
    m = self.config
    failing = {}
    for a in found:
      failing.setdefault((a["path"], a["pass"]), a)
    read = {r["path"] for r in rows if r["status"] in MEASURED}
    measured = set()
    for site_key, info in sites.items():
      if site_key.path not in read:
        continue
      for gemm, _, _ in info.operands:
        measured.add((site_key.path, PASS_OF[gemm]))
    switched = {(s["path"], s["pass"]) for s in self.switches}
    new = []
    for target in sorted(measured):
      self.streaks[target] = self.streaks.get(target, 0) + 1 if target in failing else 0
      if self.streaks[target] < m.fallback_after or target in switched:
        continue
      if len(self.switches) + len(new) >= m.max_fallback_sites:
        log.warning("step %d: monitor: %s %s fails, but monitor.max_fallback_sites = %d switches "
                    "were made; it stays in its recipe.", done, *target, m.max_fallback_sites)
        continue
      a = failing[target]
      new.append(dict(path=target[0], step=done, statistic=a["statistic"], value=a["value"],
                      threshold=a["threshold"], recipe=m.fallback_recipe, **{"pass": target[1]}))
    for s in new:
      gemms = "forward GEMM" if s["pass"] == "fwd" else "backward GEMMs (dgrad, wgrad)"
      log.warning("step %d: site fallback: %s's %s switch to %s from step %d after %d failing "
                  "measurements in a row (%s = %s, threshold %g); every block of this policy "
                  "path switches (scanned blocks share it). Switch %d of at most %d (each new "
                  "policy compiles the train step once).", done, s["path"], gemms, s["recipe"],
                  done, m.fallback_after, s["statistic"], fmt_value(s["value"]),
                  s["threshold"], len(self.switches) + 1, m.max_fallback_sites)
      self.switches.append(s)
    if new:
      self.trainer.precision.policy = fallback_lib.with_switches(self.base_policy, self.switches)
