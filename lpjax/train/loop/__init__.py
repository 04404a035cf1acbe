"""The training loop: the Trainer that joins every other part, and the process around it.

Stands on every lower part (`schema`, `config`, `outputs`, `state`, `step`, `model`, `tasks`,
`monitor`); only `cli` and lpjax.train's public API are above it. Modules: `_trainer`
(`Trainer`, `train_and_evaluate`: init or resume, train, evaluate, checkpoint, write results),
`_process` (multi-process start, SIGTERM / SIGINT handling, logging, the compilation cache).
"""
