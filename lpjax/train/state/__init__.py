"""A run's state on disk: checkpoints, resuming, the workdir lock and the run's segments.

Stands on `schema` and `config`. Modules: `_checkpoint` (Orbax checkpoints: async, atomic,
keep N, restored into the current sharding), `_resume` (does a workdir's checkpoint fit this
config; archiving a finished run), `_state_structure` (a train state's paths, shapes and dtypes,
and how two differ), `_workdir_lock` (one run per workdir), `_segments` (one segment per process
that trained in the workdir, kept in each checkpoint's meta).
"""
