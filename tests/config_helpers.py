"""Small configs shared by the trainer tests: `small()` (tiny LLaMA, a few steps) and `override`."""

from lpjax.train import llama_config


def override(c, **overrides):
  """Sets dotted keys ("optimizer.lr") of a ConfigDict; returns it."""
  for key, value in overrides.items():
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


def small(recipe="bf16", optimizer="adamw", steps=3, **overrides):
  """Tiny LLaMA, batch 8 x 32 tokens, `steps` steps, evaluation and checkpoint only at the end."""
  c = llama_config("tiny", recipe=recipe, optimizer=optimizer)
  c.steps, c.batch_size, c.seq_len = steps, 8, 32
  c.eval_every, c.eval_steps, c.checkpoint_every, c.log_every = 0, 1, 0, 1
  c.optimizer.warmup_steps = 2
  c.progress_bar = False
  c.data.prefetch = 0
  return override(c, **overrides)
