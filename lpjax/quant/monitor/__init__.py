"""lpjax.quant.monitor: per-site numerics of the quantized GEMMs, and the precision advisor.

The top layer of lpjax.quant: it stands on `intercept` and `gemm` and observes their GEMMs
without changing a bit of them (docs/numerics_monitor.md). Modules, and what they offer:
- `operand_numerics`: the statistics of one quantized operand (SNR, relative error, saturation,
  flush to zero, block-scale exponents and clamping), as float32 arrays.
- `observer`: the trace-time hooks that measure every GEMM a policy runs: the statistics of its
  six operand quantizations and weight-gradient noise, returned as cotangents of a zero "sink"
  (pure arrays, no host callback), or a forward with one chosen site quantized; `layer_site` and
  `note_block`, through which lpjax.nn's layers (which call `dot_general` themselves) declare
  their site and block.
- `sink`: the additive sums each measured GEMM call adds to its site's row (loop iterations and
  calls pool), the statistics made of them, and the readings' `status` (ok, exact, nonfinite,
  not_run).
- `table`: `SiteStats`, the table `site_stats` returns.
- `site_stats`: `site_stats` (public).
- `advisor`: `advise` and `Advice` (public).
"""
