"""python -m lpjax.export --workdir=W --out=D --format=F: a training run's newest
checkpoint as a Hugging Face LLaMA checkpoint (config.json + safetensors).

The run is read as the trainer reads it (lpjax.train): its config (<workdir>/config.json), its
newest checkpoint (<workdir>/checkpoints) and the precision schedule's state saved with it, which
give the policy the run's forward pass used at its last step. bf16 writes the master weights
rounded to bf16; the FP4 formats (nvfp4-ct and mxfp4-ct: compressed-tensors' layouts, which
transformers and vLLM load; nvfp4: NVIDIA ModelOpt's, weight-only W4A16_NVFP4 or, with
--calibration_batches=N, NVFP4 with calibrated input scales; mxfp4: gpt-oss's tensor names) pack
the linear weights that policy quantizes exactly as its forward GEMMs quantized them
(`lpjax.quant.export_weights`; lpjax/models/_hf_fp4_layouts.py has the layouts), and keep
embeddings, norms and the layers the policy kept in bf16. gguf / gguf-mxfp4 write llama.cpp's
GGUF (model.gguf: bf16, or GGML's MXFP4 type for those linear weights; lpjax/models/_gguf.py).
config.json keeps what the imported checkpoint said (max_position_embeddings, bos / eos,
rope_scaling), and the tokenizer files go beside the weights (lpjax/_export_metadata.py).

A run whose forward weight quantizer packed values cannot reproduce (the `mxfp4` preset's random
Hadamard transform, quartet's QuEST after a fixed Hadamard transform, nvfp4_4over6's scheme) is
refused with the reason; `--allow_requantize` exports the round-to-nearest-even of its trained
weights in the format instead, with a warning, recorded in config.json's quantization_config
("lpjax_requantized"): those packed values are not the ones the training forward multiplied.

Examples:
  python -m lpjax.export --workdir=runs/tiny_mxfp4 --out=exported/tiny_mxfp4 --format=mxfp4
  python -m lpjax.export --workdir=runs/tiny_mxfp4 --out=exported/tiny_rtn --format=mxfp4 \
      --allow_requantize
  python -m lpjax.export --workdir=runs/tiny_nvfp4 --out=exported/tiny_nv --format=nvfp4 \
      --calibration_batches=8
  python -m lpjax.export --workdir=runs/tiny_mxfp4 --out=exported/tiny_gguf --format=gguf-mxfp4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

FORMATS = ("bf16", "nvfp4-ct", "mxfp4-ct", "nvfp4", "mxfp4", "gguf", "gguf-mxfp4")


class ExportError(RuntimeError):
  """The workdir cannot be exported (no run, no checkpoint, not lpjax's LLaMA)."""


def load_run(workdir: str):
  """(LlamaConfig, params, policy, step, run config) of the newest checkpoint of the run in
  `workdir`."""
  import jax  # noqa: PLC0415 -- `--help` stays instant
  import ml_collections  # noqa: PLC0415

  from lpjax.models import llama  # noqa: PLC0415
  from lpjax.train import PrecisionController, make_optimizer  # noqa: PLC0415
  from lpjax.train.state._checkpoint import Checkpointer  # noqa: PLC0415
  from lpjax.train.step._step import init_state  # noqa: PLC0415
  from lpjax.train.tasks.lm import llama_config_of  # noqa: PLC0415

  config_path = os.path.join(workdir, "config.json")
  if not os.path.isfile(config_path):
    raise ExportError(f"{workdir} holds no training run ({config_path} is missing): give the "
                      "--workdir a train.py run wrote.")
  with open(config_path) as f:
    config = ml_collections.ConfigDict(json.load(f))
  if config.task != "lm" or config.model.get("factory", ""):
    raise ExportError(f"{workdir} trained {config.model.get('factory') or config.model.name}; "
                      "the Hugging Face export is for lpjax's LLaMA. For another model, "
                      "lpjax.quant.export_weights(params, policy) gives its packed weights.")
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False)
  step = ckpt.latest_step()
  if step is None:
    raise ExportError(f"{workdir}/checkpoints holds no checkpoint yet; train (or wait for the "
                      "first checkpoint_every) first.")
  structure = ckpt.saved_structure(step)
  vocab = next(shape[0] for path, (shape, _) in structure.items()
               if path.startswith("params/embed/embedding"))
  cfg = llama_config_of(config, vocab, workdir)
  controller = PrecisionController(config)
  meta = ckpt.saved_meta(step) or {}
  controller.load(meta.get("precision", {}))
  policy = controller.policy_at(int(step) - 1)  # the policy of the last step trained

  def abstract_state():
    params = llama.init_params(cfg, jax.random.key(0), controller.policy)
    tx = make_optimizer(config, stacked_layers=lambda p: llama.stacked_layers(
        cfg, p, controller.policy))
    return init_state(params, None, tx, loss_scale=config.quant.loss_scale)

  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                        jax.eval_shape(abstract_state))
  state, _ = ckpt.restore(step, target)
  ckpt.close()
  return cfg, state.params, policy, int(step), config


def run_batches(config, n: int):
  """The first `n` training batches' input tokens of the run of `config` (steps 0 .. n-1, the
  batches its trainer read), as numpy arrays."""
  import numpy as np  # noqa: PLC0415

  from lpjax import data as lpdata  # noqa: PLC0415
  from lpjax.train import config as cfg_lib  # noqa: PLC0415

  d = config.data
  dataset = lpdata.make_dataset(d.source, path=d.path, tfds_name=d.tfds_name,
                                tokenizer=d.tokenizer, tfds_data_dir=d.tfds_data_dir or None,
                                cache_dir=d.cache_dir or None, text_key=d.text_key,
                                tfds_reader=d.tfds_reader, seq_len=config.seq_len,
                                encoding=d.encoding, encoding_errors=d.encoding_errors)
  it = lpdata.batch_iterator(dataset, start_step=0, batch_size=config.batch_size,
                             seq_len=config.seq_len, seed=config.seed, num_steps=n, prefetch=0,
                             seq_len_at=lambda s: cfg_lib.seq_len_at(config, s))
  return [np.asarray(batch["inputs"]) for _, batch in it]


def export(workdir: str, out: str, fmt: str, *, allow_requantize: bool = False,
           overwrite: bool = False, calibration_batches: int | None = None) -> dict:
  """Writes the run's newest checkpoint to `out` in format `fmt`; returns a summary dict
  ("requantized": the reasons, when `allow_requantize` packed other values than the forward's).
  A non-empty `out` is refused unless `overwrite`; then it is replaced whole (written beside it,
  renamed into place). `calibration_batches` (nvfp4 only): each linear's input amax over the run's
  first N training batches as ModelOpt's `input_scale` (lpjax/models/_calibration.py)."""
  from lpjax._export_metadata import export_metadata  # noqa: PLC0415
  from lpjax.models import _calibration, _gguf, hf_llama  # noqa: PLC0415

  if fmt not in FORMATS:
    raise ExportError(f"--format={fmt!r}; valid: {', '.join(FORMATS)}.")
  from lpjax.train import ConfigError  # noqa: PLC0415

  if calibration_batches is not None and (calibration_batches <= 0 or fmt != "nvfp4"):
    raise ExportError(
        f"--calibration_batches={calibration_batches}: " + (
            "give a positive number of training batches to calibrate over (e.g. 8), or leave "
            "it out for the weight-only W4A16_NVFP4." if calibration_batches <= 0 else
            f"it calibrates ModelOpt's NVFP4 activations (--format=nvfp4); --format={fmt} is "
            "weight-only: leave it out."))

  if os.path.isdir(out) and os.listdir(out) and not overwrite:
    raise ExportError(f"--out={out} is not empty; an export never writes beside other files: give "
                      "a new or empty directory, or --overwrite to replace it.")
  try:
    cfg, params, policy, step, config = load_run(workdir)
    base, max_positions, files = export_metadata(config, workdir)
  except (ConfigError, hf_llama.CheckpointError) as error:
    raise ExportError(str(error)) from None
  try:
    with warnings.catch_warnings():  # a requantization is reported in the summary (and by main)
      warnings.filterwarnings("ignore", "export_weights: ", UserWarning)
      kw = dict(policy=policy, requantize=allow_requantize, base_config=base,
                max_positions=max_positions, files=files, overwrite=overwrite)
      if fmt in _gguf.GGUF_FORMATS:
        _gguf.save_gguf(out, cfg, params, fmt, **kw)
      else:
        if calibration_batches:
          batches = run_batches(config, calibration_batches)
          kw["input_scales"] = _calibration.input_scales(
              _calibration.input_amax(cfg, params, batches))
        hf_llama.save_pretrained(out, cfg, params, dtype=fmt, **kw)
  except ImportError as error:  # --format gguf without the gguf package
    raise ExportError(str(error)) from None
  except ValueError as error:
    raise ExportError(str(error).replace("requantize=True (python -m lpjax.export "
                                         "--allow_requantize)", "--allow_requantize")) from error
  files = sorted(os.listdir(out))
  with open(os.path.join(out, "config.json")) as f:
    requantized = json.load(f).get("quantization_config", {}).get("lpjax_requantized", {})
  return {"step": step, "format": fmt, "out": out, "files": files,
          "bytes": sum(os.path.getsize(os.path.join(out, f)) for f in files),
          "requantized": requantized.get("why", [])}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m lpjax.export", description=__doc__.split(
      "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, help="the train.py run's directory")
  parser.add_argument("--out", required=True, help="the Hugging Face checkpoint directory to write")
  parser.add_argument("--format", default="bf16", choices=FORMATS,
                      help="bf16 weights, or the run's packed linear weights: nvfp4-ct / mxfp4-ct "
                      "(compressed-tensors' nvfp4- / mxfp4-pack-quantized: transformers, vLLM), "
                      "nvfp4 (NVIDIA ModelOpt, W4A16_NVFP4), mxfp4 (gpt-oss's tensor names), "
                      "gguf / gguf-mxfp4 (llama.cpp: bf16, or GGML's MXFP4 linear weights)")
  parser.add_argument("--allow_requantize", action="store_true",
                      help="when the run's forward weight quantizer cannot be packed as it ran "
                      "(a Hadamard transform, QuEST, stochastic rounding), pack the "
                      "round-to-nearest of the trained weights instead (not the forward's values)")
  parser.add_argument("--overwrite", action="store_true",
                      help="replace a non-empty --out directory (written beside it, then renamed "
                      "into place); without it a non-empty --out is refused")
  parser.add_argument("--calibration_batches", type=int, default=None,
                      help="--format=nvfp4 only: ModelOpt's NVFP4 with activations, each linear's "
                      "input_scale = its input amax over the run's first N training batches / "
                      "(6 * 448); without it, weight-only W4A16_NVFP4")
  args = parser.parse_args(argv)
  try:
    summary = export(args.workdir, args.out, args.format, allow_requantize=args.allow_requantize,
                     overwrite=args.overwrite, calibration_batches=args.calibration_batches)
  except ExportError as error:
    print(f"error: {error}", file=sys.stderr)
    return 1
  for why in summary["requantized"]:
    print(f"warning: requantized: {why}; the packed weights are the round-to-nearest of the "
          "trained weights, NOT the values the training forward multiplied (recorded in "
          "config.json, quantization_config.lpjax_requantized).", file=sys.stderr)
  print(f"Exported step {summary['step']} of {args.workdir} as {args.format} to {args.out} "
        f"({summary['bytes'] / 1e6:.2f} MB: {', '.join(summary['files'])}).")
  return 0


if __name__ == "__main__":
  sys.exit(main())
