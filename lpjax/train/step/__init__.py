"""The compiled train step and what it is made of: mesh and shardings, optimizer, precision
schedule, and the jitted train and eval steps.

Stands on `schema` and `config` (the lower parts). Modules: `_sharding` (the device mesh and the
parameter shardings from logical axis names), `_optimizers` (optimizers by name and the papers'
schedule), `_precision` (which QuantPolicy each step uses), `_step` (the train state and the
jitted steps for any task), `_compiled_steps` (a Trainer's steps, compiled ahead of time once per
policy).
"""
