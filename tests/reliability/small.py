"""A few-step tiny LLaMA config for the in-process reliability tests."""

from lpjax.train import llama_config


def small(recipe="bf16", optimizer="adamw", steps=3, **overrides):
  c = llama_config("tiny", recipe=recipe, optimizer=optimizer)
  c.steps, c.batch_size, c.seq_len = steps, 8, 32
  c.eval_every, c.eval_steps, c.checkpoint_every, c.log_every = 0, 1, 0, 1
  c.optimizer.warmup_steps = 2
  c.progress_bar = False
  c.data.prefetch = 0
  for key, value in overrides.items():
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c
