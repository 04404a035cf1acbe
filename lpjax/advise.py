"""python -m lpjax.advise --config=C --budget=B: which GEMMs of a training run to keep in high
precision, measured (`lpjax.quant.advise`), written as the config lines train.py takes.

The run's task, model and params are built as train.py builds them (lpjax.train.Trainer): from the
newest checkpoint of --workdir when it holds one, else freshly initialised from config.seed. The
advisor measures every quantized GEMM site on --batches training batches (the batches the run
trains on next), ranks the sites (sqrt(3) gradient-noise criterion first, then `loss_delta`) and
keeps the most sensitive ones within the budget. It prints the ranking and the config lines of the
advised policy (quoted for a shell), and writes those lines to --out (one flag a line, unquoted:
`$(cat FILE)` passes them to train.py, for regexes without spaces or glob characters):

  --budget=N          keep at most N sites (policy paths; a scanned stack's blocks are one site)
  --budget=0.2        keep at most that fraction of the forward GEMM FLOPs of the measured sites
  --budget=default    choose among ALL GEMM sites (quant.policy=pure: nothing kept by name) within
                      the FLOP fraction that the run's keep list (embeddings, LM head, attention
                      products, kept blocks) keeps; the lines then hold --config.quant.policy=pure

With an int or float budget the run's own policy is measured: the sites it keeps by name stay
kept, and the advisor chooses among the others (add --config.quant.policy=pure to choose among
all). The advice is `quant.rules` (one "^<path>$->high_precision_recipe" rule per kept site, ahead
of the run's own rules; lpjax/train/schema/_quant_rules.py has the grammar).

Examples:
  python -m lpjax.advise --config=configs/llama_tiny_mxfp4.py --workdir=runs/llama_tiny_mxfp4 \\
      --budget=default --batches=2 --out=runs/advice.txt   # from the run's newest checkpoint
  python train.py --config=configs/llama_tiny_mxfp4.py $(cat runs/advice.txt) --workdir=runs/advised
  python -m lpjax.advise --config=configs/llama_tiny_mxfp4.py --budget=2 \\
      --config.quant.policy=pure                            # a fresh initialisation
Measure a trained checkpoint: at initialisation the LM head and the attention products look
harmless (docs/numerics_monitor.md, "Advisor vs the default keep list").
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
import sys
import tempfile

USAGE = ("python -m lpjax.advise --config=configs/<file>.py --budget=<int | float in [0, 1] | "
         "default> [--workdir=W] [--batches=N] [--out=FILE] [--config.<key>=<value> ...]")


class AdviseError(RuntimeError):
  """A flag or a run that the advisor cannot take (the message names the fix)."""


@dataclasses.dataclass(frozen=True)
class Advised:
  """What `advise_run` returns."""

  advice: object  # the lpjax.quant.Advice
  lines: tuple  # the config lines (argv flags) of the advised policy, as train.py takes them
  budget: float | int  # the budget given to `advise` (`default` resolved to its FLOP fraction)
  total_flops: int  # forward GEMM FLOPs of every measured site
  default_kept: tuple  # the measured sites the run's keep list keeps (with --budget=default)
  source: str  # "fresh init (seed S)" or "checkpoint step S of W"


def parse_budget(text: str):
  """`--budget`: an int (sites), a float in [0, 1] (a FLOP fraction) or "default".

  Examples:
    >>> parse_budget("3"), parse_budget("0.25"), parse_budget("default")
    (3, 0.25, 'default')
  """
  text = str(text).strip()
  if text == "default":
    return text
  try:
    value = int(text)
  except ValueError:
    try:
      value = float(text)
    except ValueError:
      value = None
  if value is None or isinstance(value, float) and not (math.isfinite(value)
                                                        and 0.0 <= value <= 1.0):
    raise AdviseError(f"--budget={text}: give an int (the most sites kept, e.g. --budget=2), a "
                      "float in [0, 1] (the most GEMM FLOPs kept, e.g. --budget=0.15) or "
                      "--budget=default (the FLOP fraction the default keep list keeps).")
  if isinstance(value, int) and value < 0:
    raise AdviseError(f"--budget={text}: a number of sites must be >= 0.")
  return value


def config_lines(policy, *, pure: bool) -> tuple[str, ...]:
  """The flags that make train.py build `policy`'s rules (and quant.policy=pure when `pure`), as
  argv items (unquoted: `shell_line` quotes them for a shell)."""
  from lpjax.train.schema._quant_rules import format_rules  # noqa: PLC0415

  lines = ("--config.quant.policy=pure",) if pure else ()
  return lines + (f"--config.quant.rules={format_rules(policy.rules)}",)


def shell_line(lines) -> str:
  """`lines` as one shell command-line fragment (each value quoted for the shell).

  Examples:
    >>> shell_line(["--config.quant.policy=pure", "--config.quant.rules=^lm_head$->bf16"])
    "--config.quant.policy=pure --config.quant.rules='^lm_head$->bf16'"
  """
  out = []
  for line in lines:
    flag, _, value = line.partition("=")
    out.append(f"{flag}={shlex.quote(value)}")
  return " ".join(out)


def _site_flops(loss_fn, params, batch, key) -> dict:
  """{policy path: forward GEMM FLOPs (all its blocks and calls)} of the quantized sites."""
  from lpjax.quant.monitor.site_stats import discover  # noqa: PLC0415

  sites = discover(lambda p, b: loss_fn(p, b, quant_key=key), params, batch)
  flops: dict = {}
  for site, info in sites.items():
    flops[site.path] = flops.get(site.path, 0) + info.flops * info.rows
  return flops


def advise_run(config, *, budget, workdir: str | None = None, batches: int = 2) -> Advised:
  """`lpjax.quant.advise` on the run of `config` (see the module docstring); `budget` as
  `parse_budget` returns it."""
  import jax  # noqa: PLC0415 -- `--help` stays instant

  from lpjax import quant  # noqa: PLC0415
  from lpjax.train import Trainer  # noqa: PLC0415

  if batches < 1:
    raise AdviseError(f"--batches={batches}: measure on at least 1 batch (2-4 is typical).")
  q = config.quant
  if budget == "default" and (q.keep_first or q.keep_last or q.keep_last_fraction):
    raise AdviseError(
        f"--budget=default with kept blocks (quant.keep_first={q.keep_first}, quant.keep_last="
        f"{q.keep_last}, quant.keep_last_fraction={q.keep_last_fraction}): the advice runs with "
        "quant.policy=pure, which keeps no blocks, and a scanned model's blocks share one path, so "
        "the advice cannot name them. Give an int or float --budget (the run's kept blocks stay "
        "kept), or set those keys to 0.")
  if workdir is not None and not os.path.isdir(workdir):
    raise AdviseError(f"--workdir={workdir} is no folder: give the workdir of a train.py run, or "
                      "leave --workdir out to measure a fresh initialisation.")
  with tempfile.TemporaryDirectory(prefix="lpjax-advise-") as scratch:
    trainer = Trainer(config, workdir if workdir is not None else scratch)
    step = trainer.checkpointer.latest_step()
    state, _ = trainer.restore_or_init()
    source = (f"checkpoint step {int(step)} of {workdir}" if step is not None
              else f"fresh init (seed {trainer.config.seed})")
    task, run_policy = trainer.task, trainer.precision.policy
    pure = budget == "default" and not run_policy.pure
    policy = dataclasses.replace(run_policy, pure=True) if pure else run_policy
    start = int(step) if step is not None else 0
    data = [batch for _, batch in task.batches(start, batches, 0, 1)]
    model_state = state.model_state

    def loss_fn(params, batch, quant_key=None):
      return task.loss(params, model_state, batch, quant_key, policy)[0]

    loss_fn.lpjax_runs_policy = True  # the model quantizes with `policy` itself
    quant_key = jax.random.fold_in(jax.random.key(trainer.config.seed), 0xAD71CE)
    flops = _site_flops(loss_fn, state.params, data[0], quant_key)
    total = sum(flops.values())
    default_kept = ()
    if budget == "default":
      keeps = dataclasses.replace(run_policy, pure=False)
      default_kept = tuple(p for p in flops if keeps.kept_high_precision(p))
      budget = sum(flops[p] for p in default_kept) / total if total else 0.0
    from lpjax.quant.monitor.advisor import NonFiniteBatch  # noqa: PLC0415

    try:
      advice = quant.advise(loss_fn, state.params, data, policy, budget=budget,
                            quant_key=quant_key)
    except NonFiniteBatch as e:
      raise AdviseError(f"{e} (measured at the {source})") from e
  return Advised(advice=advice, lines=config_lines(advice.policy, pure=pure), budget=budget,
                 total_flops=total, default_kept=default_kept, source=source)


def ranking_table(advised: Advised) -> str:
  """The ranking as a markdown table: path, mean loss_delta, grad_noise_ratio, out_snr_db, the
  site's fraction of the GEMM FLOPs, kept? (and, with --budget=default, kept by the keep list)."""
  default = bool(advised.default_kept)
  cols = ["rank", "path", "loss_delta", "grad_noise_ratio", "out_snr_db", "flops_fraction",
          "kept"] + (["kept_by_default"] if default else [])
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  total = advised.total_flops or 1
  for i, r in enumerate(advised.advice.ranking):
    if r.get("status") == "not_run":  # never ran on the measured batches (an untaken cond)
      vals = [i + 1, r["path"], "not run", "not run", "not run", f"{r['flops'] / total:.3f}", ""]
    else:
      vals = [i + 1, r["path"], f"{r['loss_delta']:.4g}", f"{r['grad_noise_ratio']:.3g}"
              + (" (< sqrt 3)" if r["fails_sqrt3"] else ""), f"{r['out_snr_db']:.1f}",
              f"{r['flops'] / total:.3f}", "yes" if r["kept"] else ""]
    if default:
      vals.append("yes" if r["path"] in advised.default_kept else "")
    lines.append("| " + " | ".join(str(v) for v in vals) + " |")
  return "\n".join(lines)


def load_config(argv):
  """(config with the --config.x=y overrides, {flag: value} of the advisor's own flags) of
  `argv` (without the program name); AdviseError for a bad flag."""
  from absl import flags  # noqa: PLC0415
  from ml_collections import config_flags  # noqa: PLC0415
  from ml_collections.config_flags.config_flags import ConfigFileFlagParser  # noqa: PLC0415

  from lpjax.train import ConfigError  # noqa: PLC0415
  from lpjax.train.cli import _cli  # noqa: PLC0415

  path = _cli.config_path_of(argv)
  if path is None:
    raise AdviseError(f"--config is required: {USAGE}")
  problem = _cli.config_file_problem(path)
  if problem:
    raise AdviseError(problem)
  if not os.path.isfile(path.split(":", 1)[0]):
    raise AdviseError(f"--config={path}: no such file; give the path of a config file, e.g. "
                      "--config=configs/llama_tiny_mxfp4.py.")
  try:
    config = ConfigFileFlagParser("config", lock_config=False).parse(path)
  except Exception as e:  # noqa: BLE001 -- the user's file
    raise AdviseError(_cli.load_error_message(path, e)) from e
  argv, unknown = _cli.split_overrides(list(argv), config)
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "config file", flag_values=fv,
                                  lock_config=True, sys_argv=["advise", *argv])
  flags.DEFINE_string("budget", None, "int sites | float FLOP fraction | default", flag_values=fv)
  flags.DEFINE_string("workdir", None, "a train.py run's workdir (its newest checkpoint)",
                      flag_values=fv)
  flags.DEFINE_integer("batches", 2, "training batches to measure on", flag_values=fv)
  flags.DEFINE_string("out", None, "file to write the config lines to", flag_values=fv)
  try:
    rest = fv(["advise", *argv])
  except (flags.Error, KeyError, AttributeError) as e:
    raise AdviseError(_cli.flag_error_message(e, config)) from e
  if len(rest) > 1:
    raise AdviseError(f"unexpected arguments {rest[1:]}: flags take the form --name=value. "
                      f"Usage: {USAGE}")
  if fv["budget"].value is None:
    raise AdviseError(f"--budget is required: {USAGE}")
  try:
    config = _cli.add_overrides(fv.config, unknown)
  except ConfigError as e:
    raise AdviseError(str(e)) from e
  return config, {name: fv[name].value for name in ("budget", "workdir", "batches", "out")}


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if any(a in ("-h", "--help", "-help", "--helpfull") for a in argv):
    print(__doc__)
    return 0
  from lpjax.train import ConfigError  # noqa: PLC0415

  try:
    config, opts = load_config(argv)
    budget = parse_budget(opts["budget"])
    advised = advise_run(config, budget=budget, workdir=opts["workdir"], batches=opts["batches"])
  except (AdviseError, ConfigError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  a = advised.advice
  what = (f"{advised.budget} sites" if isinstance(advised.budget, int)
          else f"{advised.budget:.4f} of the GEMM FLOPs" + (" (the default keep list's)"
                                                            if budget == "default" else ""))
  print(f"Measured {opts['batches']} batch(es) at the {advised.source}; budget {what}.\n")
  print(ranking_table(advised))
  print(f"\nKept in high precision: {', '.join(a.kept) or 'nothing'} "
        f"({a.kept_flops_fraction:.4f} of the GEMM FLOPs).")
  print("The advised policy, as train.py config lines:\n")
  print(shell_line(advised.lines))
  if opts["out"]:
    os.makedirs(os.path.dirname(os.path.abspath(opts["out"])), exist_ok=True)
    with open(opts["out"], "w") as f:
      f.write("\n".join(advised.lines) + "\n")
    print(f"\nWritten to {opts['out']}.")
  return 0


if __name__ == "__main__":
  sys.exit(main())
