"""The GPU check: does lpjax work on this machine, and how fast. One command, ten minutes.

    make gpu-check                         # python -m benchmarks.gpu_check, on a CUDA machine
    make gpu-check DRY_RUN=1               # every stage on the CPU, tiny sizes, < 2 minutes
    python -m benchmarks.gpu_check --stages abc      # some stages only

Stages, each in its own process with its own time limit (a failing or hung stage never stops the
next; its figures so far are kept):

  a. environment: GPU model, compute capability, memory, driver / CUDA, jax / jaxlib / plugins;
  b. exactness on the device: lpjax.quant's XLA path on the GPU vs on the host CPU, bit for bit,
     over every format, rounding and e8m0 scale mode, and edge data (NaN, Inf, zeros, subnormals,
     ties, extreme ranges, ragged and batched shapes, bf16 / fp16 inputs);
  c. the Pallas kernels compiled for real (Triton) vs the XLA path, bit for bit: quantize,
     fake_quant, dequantize, double_quantize, hadamard_quantize; RTN and SR; rows and columns;
     odd shapes; partitioned over several devices and under shard_map;
  d. bandwidth: each kernel's GB/s on 64M and 256M float32 elements as a fraction of a same-size
     device copy measured in the same process, the XLA path beside it;
  e. GEMM overhead: benchmarks/gemm_overhead.py's SwiGLU MLP per recipe vs bf16, Pallas and XLA
     quantizers;
  f. whole steps: LLaMA-60M and 130M train steps, tokens/s per recipe, compile time, peak device
     memory from the device's own statistics (each run in its own process); the 1B config's step
     on one device with the largest microbatch that fits;
  g. block-scaled GEMMs: the FP4 GEMM kernel (exact integer per-block dots; any GPU) bit for bit
     against interpret mode and timed against a bf16 GEMM, and on compute capability >= 10 the
     native block-scaled GEMM against the emulated one.

It writes a JSON file and a Markdown report (docs/results/gpu/<gpu-model>.md) and prints the
summary table last, with the goals of issue 38 beside the figures they judge.
"""
