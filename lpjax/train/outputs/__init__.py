"""What a run writes for people to read: metrics, results and the comparison of two runs.

Stands on `schema` and `config` only (today it imports neither). Modules: `_metrics`
(metrics.jsonl, TensorBoard events, the progress bar), `_results` (results.json and the summary
train.py prints), `_run_compare` (which config keys make two runs comparable, and how two runs
differ in them).
"""
