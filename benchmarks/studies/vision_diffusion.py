"""Diffusion quality of low-precision training on CPU: the tiny U-Net on the offline digits.

The tiny DDPM U-Net (`lpjax.models.unet.unet_tiny`, 164k parameters, 8x8x1) is trained on the
scikit-learn digits (1437 train / 360 test images, `lpjax.data.digits_dataset`, no network) with the
epsilon loss of a linear 1000-step schedule, once per recipe, by the diffusion recommendation:
Stable-SPAM (`lpjax.optim.stable_spam`) after global-norm gradient clipping, E4M3-scaled FP4 GEMMs
("mxfp4_e4m3scale": e2m1 elements, ue4m3 block scales at 32 with an fp32 tensor scale, RHT-32,
stochastic rounding of the backward operands; input conv, output conv, time embedding and
attention products in bf16), and full-precision validation. The baseline is the bf16 recipe
trained in the same run with the same data, optimizer and keys.

Reported per recipe: the final train loss (mean of the last 10% of steps), the held-out loss on the
test split (fixed timesteps and noise, the same for every recipe) with the training recipe and with
quantization off (`policy.with_recipe("fp32")`), the Fréchet distance in pixel space between 360 DDIM
samples (50 steps) and the test split (a cheap sample-quality proxy; not an Inception FID, whose
floor here is the train-vs-test distance printed below the table), compile time and steps/s.
A DDIM sample grid per recipe goes to --out as PNG. The last line printed is a JSON object.

Run:
  python benchmarks/studies/vision_diffusion.py                                  # ~25 min on 2 busy CPU cores
  python benchmarks/studies/vision_diffusion.py --steps=100 --recipes=bf16,mxfp4  # faster compile

Almost all of the default run is XLA compiling the mxfp4_e4m3scale train step (~16 min on a loaded
2-core CPU against ~1 min for bf16: the ue4m3-scale quantizer is a large graph per GEMM, and the
U-Net's 35 quantized layers are unrolled); the 300 steps themselves take ~1 min per recipe.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lpjax.data import image_grid, make_image_dataset, save_png
from lpjax.eval import activation_statistics, frechet_distance
from lpjax.models import diffusion, unet
from lpjax.optim import stable_spam
from lpjax.quant import QuantPolicy

EVAL_KEY = 1234  # timesteps and noise of the held-out loss (the same for every recipe)
SAMPLE_KEY = 77  # initial noise of the DDIM samples (the same for every recipe)


def _parse(argv):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--recipes", default="bf16,mxfp4_e4m3scale", help="comma-separated recipe names")
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (warm-up, cosine to 10%%)")
  p.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip")
  p.add_argument("--sample_steps", type=int, default=50, help="DDIM steps")
  p.add_argument("--num_samples", type=int, default=360, help="DDIM samples for the pixel FD")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default="runs/vision_diffusion", help="folder of the sample PNGs")
  return p.parse_args(argv)


def _make_fns(cfg: unet.UNetConfig, policy: QuantPolicy, schedule, tx):
  graphdef, _ = unet.abstract_model(cfg, policy)

  def loss_fn(params, x0, key, step_policy, train):
    k_model, k_noise = jax.random.split(key)
    eps_fn = lambda x_t, t: unet.apply(graphdef, cfg, params, x_t, t, step_policy, k_model,
                                       train=train)
    return diffusion.diffusion_loss(eps_fn, schedule, x0, k_noise)

  @jax.jit
  def train_step(params, opt_state, x0, key):
    loss, grads = jax.value_and_grad(loss_fn)(params, x0, key, None, True)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  def eval_sums(params, batch, recipe_fp32: bool):
    # quantization off: the quantized layers switch to fp32, the kept layers stay
    return _eval_sums(graphdef, cfg, schedule, params, batch,
                      policy.with_recipe("fp32") if recipe_fp32 else None)

  def sample(params, n, sample_policy=None):
    @jax.jit
    def run(params):
      eps_fn = lambda x_t, t: unet.apply(graphdef, cfg, params, x_t, t, sample_policy,
                                         jax.random.key(5))
      shape = (n, cfg.image_size, cfg.image_size, cfg.channels)
      return diffusion.ddim_sample(eps_fn, schedule, shape, jax.random.key(SAMPLE_KEY),
                                   steps=ARGS.sample_steps)
    return np.asarray(run(params))

  return train_step, jax.jit(eval_sums, static_argnums=2), sample


def _eval_sums(graphdef, cfg, schedule, params, batch, policy):
  x0, mask = batch["image"], batch["mask"]
  k_t, k_noise, k_model = jax.random.split(jax.random.key(EVAL_KEY), 3)
  t = jax.random.randint(k_t, (x0.shape[0],), 0, schedule.num_steps)
  noise = jax.random.normal(k_noise, x0.shape, jnp.float32)
  eps = unet.apply(graphdef, cfg, params, diffusion.q_sample(schedule, x0, t, noise), t, policy, k_model)
  per_example = jnp.mean(jnp.square(eps - noise), axis=(1, 2, 3))
  return jnp.sum(per_example * mask), jnp.sum(mask)


def _held_out_loss(eval_sums, params, dataset, fp32: bool, batch_size=120):
  total = count = 0.0
  for i in range(dataset.num_eval_batches(batch_size)):
    s, c = eval_sums(params, dataset.eval_batch(i, batch_size), fp32)
    total, count = total + float(s), count + float(c)
  return total / count


def _pixel_stats(images):
  return activation_statistics(np.asarray(images, np.float64).reshape(len(images), -1))


def run_recipe(recipe: str, dataset, schedule, test_stats):
  cfg = unet.unet_tiny(image_size=dataset.image_shape[0], channels=dataset.image_shape[2])
  policy = QuantPolicy.from_settings(recipe)
  lr = optax.warmup_cosine_decay_schedule(0.0, ARGS.lr, max(ARGS.steps // 15, 1), ARGS.steps, ARGS.lr * 0.1)
  tx = optax.chain(optax.clip_by_global_norm(ARGS.clip), stable_spam(learning_rate=lr))
  train_step, eval_sums, sample = _make_fns(cfg, policy, schedule, tx)
  params = unet.init_params(cfg, jax.random.key(ARGS.seed))
  opt_state = tx.init(params)
  first = dataset.train_batch(0, ARGS.batch_size, ARGS.seed)["image"]
  t0 = time.time()
  compiled = train_step.lower(params, opt_state, first, jax.random.key(0)).compile()
  compile_s = time.time() - t0
  losses, t0 = [], time.time()
  for step in range(ARGS.steps):
    x0 = dataset.train_batch(step, ARGS.batch_size, ARGS.seed)["image"]
    key = jax.random.fold_in(jax.random.key(ARGS.seed), step)
    params, opt_state, loss = compiled(params, opt_state, x0, key)
    losses.append(float(loss))
    if step % 50 == 0 or step == ARGS.steps - 1:
      print(f"[{recipe}] step {step:4d} loss {losses[-1]:.4f}", file=sys.stderr, flush=True)
  steps_per_s = ARGS.steps / (time.time() - t0)
  if not np.all(np.isfinite(losses)):
    print(f"[{recipe}] non-finite losses", file=sys.stderr)
  tail = max(ARGS.steps // 10, 1)
  result = {"recipe": recipe, "final_train_loss": float(np.mean(losses[-tail:])),
            "eval_loss": _held_out_loss(eval_sums, params, dataset, fp32=False),
            "eval_loss_fp32": _held_out_loss(eval_sums, params, dataset, fp32=True),
            "compile_s": compile_s, "steps_per_s": steps_per_s}
  samples = sample(params, ARGS.num_samples)
  result["pixel_fd"] = frechet_distance(*_pixel_stats(samples), *test_stats)
  path = os.path.join(ARGS.out, f"ddim_samples_{recipe}.png")
  save_png(path, image_grid(samples[:64], rows=8))
  result["samples_png"] = path
  return result


def main(argv=None):
  global ARGS
  ARGS = _parse(argv)
  dataset = make_image_dataset("digits")
  schedule = diffusion.linear_schedule()
  test = np.concatenate([(lambda b: b["image"][b["mask"] > 0])(dataset.eval_batch(i, 120))
                         for i in range(dataset.num_eval_batches(120))])
  train = np.concatenate([dataset.train_batch(i, 120, ARGS.seed)["image"] for i in range(3)])
  test_stats = _pixel_stats(test)
  floor = frechet_distance(*_pixel_stats(train[:len(test)]), *test_stats)
  results = [run_recipe(r, dataset, schedule, test_stats) for r in ARGS.recipes.split(",")]
  print(f"\nTiny U-Net (164k params) on digits 8x8, {ARGS.steps} steps, batch {ARGS.batch_size}, "
        f"Stable-SPAM + clip {ARGS.clip}, lr {ARGS.lr}; held-out = 360 test images.\n")
  print("| recipe | final train loss | held-out loss (recipe) | held-out loss (fp32) | pixel FD "
        f"(DDIM-{ARGS.sample_steps}) | compile s | steps/s | samples |")
  print("|---|---|---|---|---|---|---|---|")
  for r in results:
    print(f"| {r['recipe']} | {r['final_train_loss']:.4f} | {r['eval_loss']:.4f} | "
          f"{r['eval_loss_fp32']:.4f} | {r['pixel_fd']:.2f} | {r['compile_s']:.0f} | "
          f"{r['steps_per_s']:.1f} | {r['samples_png']} |")
  print(f"\nPixel FD of {len(test)} (augmented) train images vs the test split: {floor:.2f} (the floor).")
  summary = {"benchmark": "vision_diffusion", "steps": ARGS.steps, "batch_size": ARGS.batch_size,
             "pixel_fd_floor": floor, "results": results}
  print(json.dumps(summary))
  return summary


ARGS = None

if __name__ == "__main__":
  main()
