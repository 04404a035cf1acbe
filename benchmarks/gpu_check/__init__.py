"""The GPU check: does lpjax work on this machine, and how fast. One command, one 600 s call.

    make gpu-check OUT=DIR                 # python -m benchmarks.gpu_check --out DIR, on a GPU
    make gpu-check BUNDLE=.. OUT=DIR       # from an offline bundle (make gpu-bundle; README)
    make gpu-check DRY_RUN=1 OUT=DIR       # every stage on the CPU, tiny sizes (about a minute)
    python -m benchmarks.gpu_check --stages gbc --total-limit 300   # some stages, another total

The plan (`_runner.PLAN`): stages a g b c e d f, in that order (the FP4 GEMM figures and the
exactness checks first), within 540 s by default, with budgets a 25, g 75, b 60, c 80, e 60,
d 75, f 165 s; a stage may use what earlier stages left, never a later stage's budget, and
`--total-limit` scales them all (`--stages` shares the total among the stages picked). Each stage
runs in its own process with its deadline (a failing or hung stage never stops the next; its
figures so far are kept); within a stage every case is recorded on its own.

Everything goes into the OUT folder as it happens: `stage_<x>.json` flushed after every entry,
`report.md` and `<gpu-model>.json` rewritten whenever a stage records something (and on SIGTERM),
so a run killed at any point leaves a readable report naming every finished case; it says what
was skipped for time, and splits each stage's time into compile and run.

Stages:

  a. environment: GPU model, compute capability, memory, driver / CUDA, jax / jaxlib / plugins;
  b. exactness on the device: lpjax.quant's XLA path on the GPU vs on the host CPU, bit for bit,
     over every format, rounding and e8m0 scale mode, and edge data (NaN, Inf, zeros, subnormals,
     ties, extreme ranges, ragged and batched shapes, bf16 / fp16 inputs);
  c. the Pallas kernels compiled for real (Triton) vs the XLA path, bit for bit: quantize,
     fake_quant, dequantize, double_quantize, hadamard_quantize; RTN and SR; rows and columns;
     odd shapes; partitioned over several devices and under shard_map;
  d. bandwidth: each kernel's GB/s on 64M and 256M float32 elements as a fraction of a same-size
     device copy measured in the same process, the XLA path beside it;
  e. GEMM overhead: benchmarks/speed/gemm_overhead.py's SwiGLU MLP per recipe vs bf16, Pallas and XLA
     quantizers, at LLaMA-1B's width with ff = 5632 (the kernels' real tiles, no pad copies);
  f. whole steps: LLaMA-60M and 130M train steps, tokens/s per recipe, compile time, peak device
     memory from the device's own statistics (each run in its own process, with
     XLA_PYTHON_CLIENT_MEM_FRACTION=0.95, recorded); the 1B config's step on one device with the
     largest microbatch that fits;
  g. block-scaled GEMMs: the FP4 GEMM kernel (exact integer per-block dots; any GPU) bit for bit
     against interpret mode and timed against a bf16 GEMM, and on compute capability >= 10 the
     native block-scaled GEMM against the emulated one.

It prints the summary table last, with the goals of issue 38 beside the figures they judge; commit
OUT/report.md as docs/results/gpu/<gpu-model>.md. `LPJAX_GPU_CHECK_HANG=<letters>` makes those
stages hang after their first check (the rehearsal in tests/benchmarks/gpu_check/test_gpu_check_rehearsal.py).
"""
