"""The trainer's `monitor` section: per-site FP4 numerics measured while training, their
records and heatmap, alerts, and per-site fallback to a safer recipe.

Stands on `outputs` (its rows go to the metrics) and the lower parts. Modules: `_monitor` (the
monitor a Trainer runs every `monitor.every` steps), `_monitor_rows` (one monitor.jsonl line per
site and block, and the thresholds it crosses), `_monitor_heatmap` (monitor_heatmap.png),
`_site_fallback` (a site switching to `monitor.fallback_recipe` after failing measurements).
"""
