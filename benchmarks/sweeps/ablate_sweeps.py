"""The ablation sweeps of benchmarks/sweeps/ablate.py: rows as data, and the config of one (row, seed).

A row is a recipe spec (`lpjax.quant.recipes.variants`), an optimizer with its paper settings, a
learning-rate multiple and a few config overrides, applied on top of the size's paper run,
configs/llama_<size>_bf16.py ("tiny" at CPU scale). Every sweep starts with the
reference row FP32 + Adam, against which every table reports its loss ratio.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import shlex
from typing import Any

import ml_collections

from lpjax.train import config as cfg_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Row:
  label: str  # row name (a directory name: letters, digits, _ and -)
  recipe: str = "fp32"  # quant.recipe: a preset or a "<preset>:key=value,..." spec
  optimizer: str = "adam"  # optimizer.name, with that optimizer's paper hyperparameters
  lr_scale: float = 1.0  # multiple of the size's paper learning rate
  overrides: tuple[tuple[str, Any], ...] = ()  # (flat config key, value) on top


REFERENCE = Row("fp32_adam", "fp32", "adam")
# Stable-SPAM's AdaGN decays in the paper's high-precision runs (the defaults are its 4-bit ones)
HP_GAMMAS = (("optimizer.gamma1", 0.85), ("optimizer.gamma2", 0.99999))
HP_FRACTION = 0.1  # schedule sweep: high-precision (bf16) share of the steps at the start / end


def _lr_suffix(scale: float) -> str:
  return "" if scale == 1.0 else f"_lr{scale:g}x"


def _grid(recipes, optimizers, scales, overrides=(), tag=""):
  """A row per (recipe, optimizer, lr multiple): "<recipe>_<optimizer><tag>[_lr<scale>x]"."""
  return [Row(f"{recipe}_{opt}{tag}{_lr_suffix(scale)}", recipe, opt, scale, overrides)
          for recipe in recipes for opt in optimizers for scale in scales]


def _named(*rows):
  return [REFERENCE] + [r for r in rows if r.label != REFERENCE.label]


# Issue 41: each optimizer's own lr grid around the paper lr (Adam's best was at or below 0.5x,
# Stable-SPAM's at 0.5x-1x in the 1000-step lr sweep), the FP4 recipes and bf16.
OPTIM_LR_SCALES = {"adam": (0.125, 0.25, 0.5, 1.0, 2.0), "stable_spam": (0.25, 0.5, 1.0, 2.0, 4.0),
                   "spam": (0.25, 0.5, 1.0, 2.0, 4.0)}
OPTIM_LR_RECIPES = ("mxfp4", "nvfp4", "bf16")
# Stable-SPAM's parts, switched off or changed one at a time with the trainer's own settings:
# gamma3 = 0 makes AdaClip's threshold this step's max|g| (nothing is above it: AdaClip off),
# reset_interval = 0 never resets the moments; without AdaClip and resets Stable-SPAM is Adam +
# AdaGN (optimizer.total_steps 0, the default: no cosine factor on b1 and gamma1).
NO_ADACLIP = (("optimizer.gamma3", 0.0),)
NO_RESET = (("optimizer.reset_interval", 0),)
# The reference training script's settings: total_T = the run (b1 and gamma1 decay by a cosine to
# 0.5x) and no global-norm clipping (the trainer's defaults: no total_T, clipping at 1.0).
REFERENCE_SCRIPT = (("optimizer.total_steps", -1), ("optimizer.grad_clip", 0.0))
# The paper resets every 1000 of 20k steps (ΔT/T = 1/20): at 1000 steps that is every 50.
SSPAM_PARTS = (
    ("adagn", "stable_spam", NO_ADACLIP + NO_RESET),  # Adam + AdaGN
    ("adagn_adaclip", "stable_spam", NO_RESET),  # + AdaClip, no reset
    ("full", "stable_spam", ()),  # + reset every 1000 steps (paper 4-bit settings)
    ("reset50", "stable_spam", (("optimizer.reset_interval", 50),)),  # paper's ΔT/T at 1000 steps
    ("reset250", "stable_spam", (("optimizer.reset_interval", 250),)),
    ("hp_gammas", "stable_spam", HP_GAMMAS),  # AdaGN with the paper's BF16 decays
    ("adagn_hp", "stable_spam", HP_GAMMAS + NO_ADACLIP + NO_RESET),  # Adam + slow AdaGN
    ("adam", "adam", ()),  # none of the parts
    # the reference training script's settings, then each of the two alone
    ("paper_run", "stable_spam", REFERENCE_SCRIPT),
    ("total_t", "stable_spam", REFERENCE_SCRIPT[:1]),
    ("noclip", "stable_spam", REFERENCE_SCRIPT[1:]),
)
SSPAM_PARTS_SCALES = (0.5, 1.0)


def _optim_lr_rows():
  rows = [Row(f"{recipe}_{opt}{_lr_suffix(scale)}", recipe, opt, scale)
          for recipe in OPTIM_LR_RECIPES for opt in ("adam", "stable_spam", "spam")
          for scale in OPTIM_LR_SCALES[opt]]
  # quartet for the two optimizers the MXFP4 / NVFP4 comparison is about
  rows += [Row(f"quartet_{opt}{_lr_suffix(scale)}", "quartet", opt, scale)
           for opt in ("adam", "stable_spam") for scale in (0.25, 0.5, 1.0, 2.0)]
  return rows


# Stable-SPAM with the reference script's settings against Adam, each over its own lr grid, in the
# other recipes (and the MXFP4 lr curve of the reference settings beyond 0.5x-1x).
# (MXFP4's 0.5x and 1x are the parts rows above; quartet for the two optimizers the question is about)
SSPAM_REF_SCALES = {"mxfp4": (0.25, 2.0), "nvfp4": (0.25, 0.5, 1.0), "bf16": (0.25, 0.5, 1.0),
                    "quartet": (0.25, 0.5, 1.0, 2.0)}
# SPAM (the trainer's settings: clipping at 1.0) as the third optimizer of the comparison
SSPAM_SPAM_SCALES = {"mxfp4": (0.25, 0.5, 1.0, 2.0), "nvfp4": (0.5, 1.0), "bf16": (0.5, 1.0)}


def _sspam_parts_rows():
  rows = [Row(f"mxfp4_{name}{_lr_suffix(scale)}", "mxfp4", opt, scale, overrides)
          for scale in SSPAM_PARTS_SCALES for name, opt, overrides in SSPAM_PARTS]
  for recipe, scales in SSPAM_REF_SCALES.items():
    rows += [Row(f"{recipe}_paper_run{_lr_suffix(s)}", recipe, "stable_spam", s, REFERENCE_SCRIPT)
             for s in scales]
    rows += [Row(f"{recipe}_adam{_lr_suffix(s)}", recipe, "adam", s) for s in scales]
  for recipe, scales in SSPAM_SPAM_SCALES.items():
    rows += [Row(f"{recipe}_spam{_lr_suffix(s)}", recipe, "spam", s) for s in scales]
  # the trainer's settings (clipping at 1.0, no total_T) in NVFP4: whether the reference settings'
  # gain carries over from MXFP4
  rows.append(Row("nvfp4_full_lr0.5x", "nvfp4", "stable_spam", 0.5))
  return rows


SWEEPS: dict[str, list[Row]] = {
    # Element / block format: every preset's GEMMs, Adam (mxfp4_bwd / mxfp4_naive for the goals).
    "format": _named(*(Row(n, n) for n in ("bf16", "fp8", "mxfp8", "mxfp4", "nvfp4", "mxfp4_bwd",
                                           "mxfp4_naive"))),
    # E8M0 vs E4M3 block scales, same e2m1 elements and block size (32 RTN, 32 full recipe, 16).
    "scale_format": _named(
        Row("naive_b32_e8m0", "mxfp4_naive"), Row("naive_b32_ue4m3", "mxfp4_naive:scale=ue4m3"),
        Row("mxfp4_b32_e8m0", "mxfp4"), Row("mxfp4_b32_ue4m3", "mxfp4_e4m3scale"),
        Row("nvfp4_b16_e8m0", "nvfp4:scale=e8m0"), Row("nvfp4_b16_ue4m3", "nvfp4")),
    # Rounding of the gradient operand dY (every other operand round-to-nearest-even).
    "grad_rounding": _named(*(Row(m, "mxfp4_naive" if m == "nearest_even" else
                                  f"mxfp4_naive:grad_rounding={m}")
                              for m in ("nearest_even", "stochastic", "toward_zero", "toward_positive"))),
    # Scaling granularity: per block (e8m0), per row, per tensor (fp32 / e8m0 current), fixed 2^0.
    "granularity": _named(
        Row("block32", "mxfp4_naive"), Row("channel", "mxfp4_naive:granularity=channel"),
        Row("tensor", "mxfp4_naive:granularity=tensor"),
        Row("tensor_e8m0", "mxfp4_naive:granularity=tensor,scale=e8m0"),
        Row("fixed", "mxfp4_naive:granularity=fixed")),
    # Which GEMMs are MXFP4; pure = embeddings, LM head and attention products quantized too.
    "gemms": _named(Row("none_bf16", "bf16"), Row("fwd", "mxfp4:gemms=fwd"),
                    Row("bwd", "mxfp4:gemms=bwd"), Row("all", "mxfp4"),
                    Row("pure", "mxfp4", overrides=(("quant.policy", "pure"),))),
    # Which tensor (X, W, dY in every GEMM) and which GEMM carries MXFP4's gap: one at a time.
    "operands": _named(
        Row("all", "mxfp4"), Row("x", "mxfp4:operands=x"), Row("w", "mxfp4:operands=w"),
        Row("dy", "mxfp4:operands=dy"), Row("fwd", "mxfp4:gemms=fwd"),
        Row("dgrad", "mxfp4:gemms=dgrad"), Row("wgrad", "mxfp4:gemms=wgrad")),
    # Optimizers at the paper lr and 3x, in FP32 and MXFP4.
    "optimizer": _named(*_grid(("fp32", "mxfp4"), ("adam", "spam", "stable_spam"), (1.0, 3.0))),
    # Adam against Stable-SPAM across learning rates (where one beats the other), FP32 and MXFP4.
    "lr": _named(*_grid(("fp32", "mxfp4"), ("adam", "stable_spam"), (0.25, 0.5, 1.0, 2.0)),
                 *_grid(("fp32",), ("stable_spam",), (0.5, 1.0, 2.0), HP_GAMMAS, "_hp_gammas"),
                 *_grid(("mxfp4",), ("stable_spam",), (1.0,), HP_GAMMAS, "_hp_gammas")),
    # Issue 41: Adam, Stable-SPAM and SPAM each over its own lr grid, in MXFP4, NVFP4 and bf16
    # (quartet for Adam and Stable-SPAM); compare each at its own best lr.
    "optim_lr": _named(*_optim_lr_rows()),
    # Issue 41: Stable-SPAM's parts in MXFP4 at 0.5x and 1x the paper lr, from Adam + AdaGN to the
    # full optimizer, the reset interval scaled to the run, and the paper's BF16 AdaGN decays.
    "sspam_parts": _named(*_sspam_parts_rows()),
    # High-precision (bf16) warm-up and finish around MXFP4.
    "schedule": _named(
        Row("mxfp4_only", "mxfp4"),
        Row("warmup", "mxfp4", overrides=(("quant.warmup_fraction", HP_FRACTION),)),
        Row("finish", "mxfp4", overrides=(("quant.finish_fraction", HP_FRACTION),)),
        Row("warmup_finish", "mxfp4", overrides=(("quant.warmup_fraction", HP_FRACTION),
                                                 ("quant.finish_fraction", HP_FRACTION)))),
    # MXFP4 RTN block size.
    "block_size": _named(Row("b16", "mxfp4_naive:block_size=16"), Row("b32", "mxfp4_naive"),
                         Row("b64", "mxfp4_naive:block_size=64")),
    # Every FP4 preset side by side (and the NVIDIA layer policy, the QAF finish, Stable-SPAM),
    # meant for 1000+ steps and 3 seeds, where the ranking is stable.
    "recipes": _named(
        Row("bf16", "bf16"), Row("mxfp4_naive", "mxfp4_naive"), Row("mxfp4", "mxfp4"),
        Row("nvfp4", "nvfp4"),
        Row("nvfp4_nvidia", "nvfp4", overrides=(("quant.keep_last_fraction", 0.15),)),
        Row("quartet", "quartet"), Row("nvfp4_4over6", "nvfp4_4over6"), Row("quartet2", "quartet2"),
        Row("mxfp4_qaf", "mxfp4", overrides=(("quant.qaf_fraction", HP_FRACTION),)),
        Row("mxfp4_bwd", "mxfp4_bwd"), Row("nvfp4_bwd_ms_eden", "nvfp4_bwd_ms_eden"),
        Row("fp32_stable_spam", "fp32", "stable_spam"), Row("mxfp4_stable_spam", "mxfp4", "stable_spam")),
    # Memory options of the 1B config (issue 18) on the tiny model: its MXFP4 + Stable-SPAM with
    # bf16 moments, then bf16 master weights (stochastic / nearest updates), then bf16 gradient
    # accumulators.
    "memory": _named(
        Row("mxfp4_sspam", "mxfp4", "stable_spam"),  # float32 moments: what bf16 moments save on
        Row("mxfp4_sspam_bf16state", "mxfp4", "stable_spam",
            overrides=(("optimizer.state_dtype", "bfloat16"),)),
        Row("mxfp4_sspam_bf16state_bf16params", "mxfp4", "stable_spam",
            overrides=(("optimizer.state_dtype", "bfloat16"), ("model.param_dtype", "bfloat16"))),
        Row("mxfp4_sspam_bf16state_bf16params_rne", "mxfp4", "stable_spam",
            overrides=(("optimizer.state_dtype", "bfloat16"), ("model.param_dtype", "bfloat16"),
                       ("optimizer.param_rounding", "nearest"))),
        # 4 microbatches (as the 1B config's 8), their gradients summed in float32 / bfloat16 (SR)
        Row("mxfp4_sspam_bf16state_bf16params_accum4", "mxfp4", "stable_spam",
            overrides=(("optimizer.state_dtype", "bfloat16"), ("model.param_dtype", "bfloat16"),
                       ("grad_accum_steps", 4))),
        Row("mxfp4_sspam_bf16state_bf16params_bf16accum4", "mxfp4", "stable_spam",
            overrides=(("optimizer.state_dtype", "bfloat16"), ("model.param_dtype", "bfloat16"),
                       ("grad_accum_steps", 4), ("grad_accum_dtype", "bfloat16"))),
        # ... and the LM head + loss over 4 vocabulary slices (as the 1B config's 8)
        Row("mxfp4_sspam_bf16state_bf16params_bf16accum4_vocab4", "mxfp4", "stable_spam",
            overrides=(("optimizer.state_dtype", "bfloat16"), ("model.param_dtype", "bfloat16"),
                       ("grad_accum_steps", 4), ("grad_accum_dtype", "bfloat16"),
                       ("model.vocab_chunks", 4)))),
    # Exactly the rows the quality goals compare (ablate_report.quality_goals).
    "quality": _named(
        Row("mxfp4_bwd_adam", "mxfp4_bwd"), Row("mxfp4_adam", "mxfp4"), Row("nvfp4_adam", "nvfp4"),
        Row("mxfp4_naive_adam", "mxfp4_naive"), Row("fp32_stable_spam", "fp32", "stable_spam"),
        Row("mxfp4_stable_spam", "mxfp4", "stable_spam"), Row("mxfp4_adam_lr3x", "mxfp4", "adam", 3.0),
        Row("mxfp4_stable_spam_lr3x", "mxfp4", "stable_spam", 3.0)),
}
SWEEP_NAMES = tuple(SWEEPS)
DESCRIPTIONS = {
    "format": "Element / block format of all three GEMMs (Adam), with mxfp4_bwd and mxfp4_naive.",
    "scale_format": "E8M0 vs E4M3 (ue4m3, with the fp32 tensor scale) block scales, same e2m1 "
                    "elements and block size: RTN at 32, the full mxfp4 recipe at 32 "
                    "(mxfp4_e4m3scale has no SR pre-scale), nvfp4 at 16.",
    "grad_rounding": "Rounding of the gradient operand dY in dgrad and wgrad; every other operand "
                     "MXFP4 round-to-nearest-even (mxfp4_naive).",
    "granularity": "Scaling granularity of every MXFP4 operand (RTN): e8m0 per 32-block, fp32 per "
                   "row of the contraction axis, fp32 per tensor (global), e8m0 per tensor, all "
                   "from the current amax; and a fixed scale 2^0 that ignores the data.",
    "gemms": "Which GEMMs run MXFP4: forward only, backward only (dgrad + wgrad), all three, and "
             "pure (embeddings, LM head and attention products too).",
    "operands": "Which tensor and which GEMM carry the gap of the mxfp4 recipe: every operand "
                "MXFP4, then only X (forward and wgrad), only W (forward and dgrad), only dY "
                "(dgrad and wgrad), and only the forward, dgrad or wgrad GEMM (both operands).",
    "optimizer": "Adam, SPAM and Stable-SPAM at the paper lr and at 3x, in FP32 and MXFP4.",
    "lr": "Adam and Stable-SPAM at 0.25x, 0.5x, 1x and 2x the paper lr, in FP32 and MXFP4: whether "
          "Stable-SPAM's lead or lag at one lr is an lr effect; and Stable-SPAM with the paper's "
          "high-precision AdaGN decays (gamma1 0.85, gamma2 0.99999) instead of its 4-bit ones.",
    "optim_lr": "Adam, Stable-SPAM and SPAM (paper hyperparameters) each over its own lr grid "
                "(Adam 0.125x-2x, Stable-SPAM and SPAM 0.25x-4x the paper lr), in MXFP4, NVFP4 "
                "and bf16, and quartet for Adam and Stable-SPAM at 0.25x-2x: each optimizer at "
                "its own best lr (issue 41).",
    "sspam_parts": "Stable-SPAM's parts in MXFP4 at 0.5x and 1x the paper lr: Adam + AdaGN "
                   "(gamma3 0: AdaClip off; reset_interval 0), + AdaClip, + the momentum reset "
                   "every 1000 steps (the full optimizer, paper 4-bit settings), the reset every "
                   "50 steps (the paper's 1000 of 20k steps scaled to 1000) and every 250, the "
                   "paper's BF16 AdaGN decays (0.85, 0.99999) with and without AdaClip and "
                   "resets, and Adam (none of the parts); the reference script's settings "
                   "(total_T = the run, no global clipping) alone and each of the two; and Adam "
                   "against Stable-SPAM with those settings over an lr grid in MXFP4, NVFP4, bf16 "
                   "and quartet, with SPAM as the third optimizer (issue 41).",
    "schedule": f"MXFP4 with and without bf16 for the first / last {HP_FRACTION:.0%} of the steps.",
    "block_size": "MXFP4 RTN (mxfp4_naive) with blocks of 16, 32 and 64.",
    "recipes": "Every FP4 preset against FP32 Adam at equal steps: full-FP4 (mxfp4_naive, mxfp4, "
               "nvfp4, nvfp4 with its last 15% of blocks in bf16, quartet, nvfp4_4over6, quartet2), the "
               f"QAF finish (last {HP_FRACTION:.0%} forward-only), backward-only (mxfp4_bwd, "
               "nvfp4_bwd_ms_eden) and Stable-SPAM in FP32 and MXFP4.",
    "memory": "Memory options of configs/llama_1b_mxfp4.py at tiny scale: MXFP4 + Stable-SPAM with "
              "float32, then bf16 moments, plus bf16 master weights updated with stochastic "
              "rounding, or to nearest; then 4 microbatches with float32 or bf16 (stochastic "
              "rounding) gradient accumulators; then the LM head and loss over 4 vocabulary "
              "slices.",
    "quality": "The rows of the issue's quality goals (quality_goals.md).",
}


def set_key(config, key: str, value):
  """config[key] = value for a flat key ("optimizer.lr"); strings are cast to the field's type."""
  *path, leaf = key.split(".")
  node = config
  for part in path:
    if part not in node or not isinstance(node[part], ml_collections.ConfigDict):
      raise KeyError(f"Unknown config key {key!r}; see lpjax/train/config.py base_config().")
    node = node[part]
  if leaf not in node:
    raise KeyError(f"Unknown config key {key!r}; see lpjax/train/config.py base_config().")
  old = node[leaf]
  if isinstance(value, str) and not isinstance(old, str):
    try:
      value = ast.literal_eval(value)
    except (ValueError, SyntaxError) as e:
      raise ValueError(f"{key}={value!r}: expected a {type(old).__name__} like {old!r}.") from e
  if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  node[leaf] = value


def parse_sets(items) -> tuple[tuple[str, str], ...]:
  """["batch_size=8", ...] (the --set flags) -> (("batch_size", "8"), ...)."""
  out = []
  for item in items or ():
    key, eq, value = item.partition("=")
    if not eq or not key:
      raise ValueError(f"--set {item!r} is not key=value, e.g. --set batch_size=8.")
    out.append((key.strip(), value.strip()))
  return tuple(out)


def row_config(row: Row, *, size: str, seed: int, steps: int | None = None, sets=()):
  """The training config of (row, seed): paper settings of `size`, then the row, then `sets`.

  With `steps`, the lr warm-up keeps its share of the run (at least one step).
  """
  c = load_config_file(f"configs/llama_{size}_bf16.py")  # the size's paper run
  paper_steps, paper_warmup, paper_lr = c.steps, c.optimizer.warmup_steps, c.optimizer.lr
  c.quant.recipe = row.recipe
  c.optimizer.name = row.optimizer
  c.optimizer.update(cfg_lib.optimizer_defaults(row.optimizer))  # its paper b1, b2, eps, ...
  c.seed = seed
  c.progress_bar = False
  if steps:
    c.steps = steps
    c.optimizer.warmup_steps = max(1, round(paper_warmup * steps / paper_steps))
  c.optimizer.lr = paper_lr * row.lr_scale
  for key, value in tuple(row.overrides) + tuple(sets):
    set_key(c, key, value)
  return c


def flat(config, prefix="") -> dict:
  """{"optimizer.lr": 0.003, ...} of a ConfigDict."""
  out = {}
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      out.update(flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def base_config_file(size: str) -> str:
  """The config file a row's command starts from (relative to the repository)."""
  return f"configs/llama_{size}_mxfp4.py"


def load_config_file(path: str):
  """The config of `path`, relative to the repository root."""
  return cfg_lib.load_config_file(os.path.join(REPO, path))


_NOT_IN_COMMAND = ("progress_bar", "seed")  # display only / given separately


def reproduce_command(config, size: str, workdir: str) -> str:
  """`python train.py --config=<file> --config.k=v ...` that trains exactly `config`."""
  base_file = base_config_file(size)
  base = flat(load_config_file(base_file))
  parts = ["python", "train.py", f"--config={base_file}"]
  for key, value in sorted(flat(config).items()):
    if key in _NOT_IN_COMMAND or base.get(key) == value:
      continue
    parts.append(f"--config.{key}={shlex.quote(str(value))}")
  parts.append(f"--config.seed={config.seed}")
  parts.append(f"--workdir={shlex.quote(workdir)}")
  return " ".join(parts)
