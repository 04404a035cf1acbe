"""Vision quality of low-precision training: classification (and, later, diffusion) on CPU.

Classification: the tiny ResNet (basic blocks, widths 16/32/64, small stem) on the offline digits
dataset (scikit-learn, 1437 train / 360 test images, 8x8), trained with each recipe and several
seeds by Adam with dynamic loss scaling and non-finite-step skipping; the "mxfp4" preset is the
recommended classification recipe (E8M0-scaled MXFP4 on all three GEMMs of every conv except the
stem and the classifier, stochastic rounding of the gradients, RHT-32). Reported: test top-1
accuracy, mean ± std over seeds, evaluated in bf16 and with MXFP4 forward GEMMs (for a bf16-trained
model the latter is post-training quantization). The baseline is the bf16 recipe trained in the
same run. Targets: bf16 above 90%, mxfp4 within 2 points of it. The last line printed is a JSON
object with every number.

Run:
  python benchmarks/studies/vision_quality.py                              # all sections
  python benchmarks/studies/vision_quality.py --section=classification --steps=300 --seeds=3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax

from lpjax.data import digits_dataset
from lpjax.models import resnet
from lpjax.optim import DynamicLossScale, all_finite, skip_nonfinite
from lpjax.quant import QuantPolicy

SECTIONS = ("classification", "diffusion")


# --- classification -------------------------------------------------------------------------------


def _classifier_config() -> resnet.ResNetConfig:
  return resnet.ResNetConfig(name="resnet_tiny", num_classes=10, in_channels=1, stem="small")


def _make_classifier_fns(recipe: str, lr: float, steps: int):
  """(init, jitted train step, jitted eval) of the tiny ResNet trained with `recipe`."""
  cfg = _classifier_config()
  policy = QuantPolicy.from_settings(recipe)
  graphdef, _, _ = resnet.abstract_model(cfg, policy)
  schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(steps // 20, 1), steps, lr * 0.01)
  tx = skip_nonfinite(optax.adam(schedule))

  def loss_fn(params, stats, batch, key, loss_scale):
    logits, stats = resnet.apply(graphdef, cfg, params, stats, batch["image"], None, key, train=True)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
    return loss_scale.scale(loss), (loss, stats)

  @jax.jit
  def train_step(state, batch, key):
    params, stats, opt_state, loss_scale = state
    grads, (loss, stats) = jax.grad(loss_fn, has_aux=True)(params, stats, batch, key, loss_scale)
    grads = loss_scale.unscale(grads)
    loss_scale = loss_scale.adjust(all_finite(grads))
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), stats, opt_state, loss_scale), loss

  @jax.jit
  def init(key):
    params, stats = resnet.init_variables(cfg, key)
    return params, stats, tx.init(params), DynamicLossScale()

  def make_eval(eval_recipe):
    """The eval of the quantized layers in `eval_recipe` (stem and classifier stay bf16)."""
    eval_policy = policy.with_recipe(eval_recipe)

    @jax.jit
    def correct(params, stats, batch):
      logits, _ = resnet.apply(graphdef, cfg, params, stats, batch["image"], eval_policy,
                               jax.random.key(0), train=False)
      hits = (jnp.argmax(logits, -1) == batch["label"]).astype(jnp.float32)
      return jnp.sum(hits * batch["mask"])
    return correct

  return init, train_step, make_eval


def _accuracy(correct_fn, params, stats, data, batch_size: int = 120) -> float:
  total = sum(float(correct_fn(params, stats, data.eval_batch(i, batch_size)))
              for i in range(data.num_eval_batches(batch_size)))
  return total / data.eval_size


def classification(args) -> dict:
  """Trains the tiny ResNet on digits per recipe and seed; prints the table, returns the numbers."""
  data = digits_dataset()
  recipes = args.recipes.split(",")
  results = {}
  for recipe in recipes:
    init, train_step, make_eval = _make_classifier_fns(recipe, args.lr, args.steps)
    evals = {"bf16": make_eval("bf16"), "mxfp4": make_eval("mxfp4")}
    runs = []
    for seed in range(args.seeds):
      t0 = time.perf_counter()
      state = init(jax.random.key(seed))
      for step in range(args.steps):
        batch = data.train_batch(step, args.batch_size, seed=seed)
        state, loss = train_step(state, batch, jax.random.fold_in(jax.random.key(1000 + seed), step))
      params, stats, opt_state, loss_scale = state
      run = {"seed": seed, "final_train_loss": float(loss),
             "skipped_steps": int(opt_state.skipped), "loss_scale": float(loss_scale.loss_scale),
             "seconds": time.perf_counter() - t0}
      for name, fn in evals.items():
        run[f"top1_eval_{name}"] = _accuracy(fn, params, stats, data)
      runs.append(run)
      print(f"  {recipe} seed {seed}: " + ", ".join(
          f"{k} {v:.4g}" for k, v in run.items() if k != "seed"), file=sys.stderr, flush=True)
    results[recipe] = runs

  def stat(recipe, key):
    values = [100 * r[key] for r in results[recipe]]
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)

  print(f"\nTiny ResNet on digits ({data.train_size} train / {data.eval_size} test, 8x8), "
        f"{args.steps} steps of batch {args.batch_size}, Adam lr {args.lr} (warm-up + cosine), "
        f"dynamic loss scaling; test top-1 accuracy (%), mean ± std over {args.seeds} seeds "
        "(the first run of a recipe includes its compilation).\n")
  print("| train recipe | eval bf16 | eval mxfp4 fwd | final train loss | skipped steps | "
        "median s / run |")
  print("|---|---|---|---|---|---|")
  summary = {}
  for recipe in recipes:
    b, q = stat(recipe, "top1_eval_bf16"), stat(recipe, "top1_eval_mxfp4")
    runs = results[recipe]
    summary[recipe] = {"top1_eval_bf16": b, "top1_eval_mxfp4": q}
    print(f"| {recipe} | {b[0]:.2f} ± {b[1]:.2f} | {q[0]:.2f} ± {q[1]:.2f} | "
          f"{statistics.mean(r['final_train_loss'] for r in runs):.3f} | "
          f"{sum(r['skipped_steps'] for r in runs)} | "
          f"{statistics.median(r['seconds'] for r in runs):.1f} |")
  targets = {}
  if "bf16" in summary:
    base = summary["bf16"]["top1_eval_bf16"][0]
    targets["bf16_above_90"] = base > 90.0
    for recipe in recipes:
      if recipe != "bf16":  # a quantized recipe's own (quantized-forward) accuracy vs bf16
        own = summary[recipe]["top1_eval_mxfp4" if "fp4" in recipe else "top1_eval_bf16"][0]
        targets[f"{recipe}_within_2_points"] = base - own <= 2.0
  print("\nTargets: " + ", ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in targets.items()))
  return {"section": "classification", "model": "resnet_tiny", "dataset": "digits",
          "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "seeds": args.seeds,
          "summary": {r: {k: {"mean": v[0], "std": v[1]} for k, v in s.items()}
                      for r, s in summary.items()},
          "runs": results, "targets": targets}


# --- diffusion ------------------------------------------------------------------------------------


def diffusion(args) -> dict | None:
  """The tiny U-Net half: benchmarks/studies/vision_diffusion.py (bf16 vs E4M3-scaled FP4, final and
  held-out losses, a DDIM sample grid per recipe in runs/vision_diffusion/), with --steps."""
  sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", d)
                  for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/
  import vision_diffusion

  return vision_diffusion.main([f"--steps={args.steps}"])


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--section", default="all", choices=SECTIONS + ("all",))
  p.add_argument("--recipes", default="bf16,mxfp4", help="comma-separated train recipes")
  p.add_argument("--seeds", type=int, default=3)
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--batch-size", type=int, default=128)
  p.add_argument("--lr", type=float, default=3e-3)
  args = p.parse_args(argv)
  sections = SECTIONS if args.section == "all" else (args.section,)
  out = {}
  for name in sections:
    result = globals()[name](args)
    if result is not None:
      out[name] = result
  print(json.dumps(out, default=float))
  return out


if __name__ == "__main__":
  main()
