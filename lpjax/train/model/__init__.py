"""The user's own Flax model in the trainer (`model.factory="package.module:build"`).

Stands on `config` and `step` (its parameters are sharded by `step._sharding`'s rules).
Modules: `_user_model` (the model wrapped for the trainer's tasks), `_user_factory` (the factory
found and called with the arguments it takes), `_user_model_axes` (its parameters' logical axes
and the partition rules that shard them).
"""
