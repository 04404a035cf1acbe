"""The packed FP4 layouts of a Hugging Face export: each linear weight's tensors, config.json's
`quantization_config`.

`QUANT_LAYOUTS` are the public FP4 layouts lpjax exports; each takes the packed weights of
`lpjax.quant.export_weights` (the codes and scales the run's forward GEMMs multiplied) as they are.
Every layout packs two E2M1 codes a byte, element 2i in the low nibble (sign bit 3, OCP E2M1).
- nvfp4-ct: compressed-tensors' `nvfp4-pack-quantized` (weight-only, its NVFP4A16 scheme), which
  transformers (with the compressed-tensors package) and vLLM load: `<name>.weight_packed` uint8
  (out, in/2), `<name>.weight_scale` float8_e4m3fn (out, in/16), `<name>.weight_global_scale`
  float32 (1,) = 2688 / amax_t (compressed-tensors stores the reciprocal: a decoder forms
  e2m1 * (s_b / global_scale)); quantization_config quant_method "compressed-tensors",
  strategy "tensor_group", group_size 16, "ignore" the kept modules (compressed_tensors/
  compressors/nvfp4/base.py and quantization/quant_scheme.py, NVFP4A16; the global scale as
  quantization/utils/helpers.py generate_gparam writes it: 448 * 6 / amax, float32 (1,)).
  compressed-tensors 0.20.1 decompresses it into bfloat16 whatever dtype the model loads in
  (nvfp4/helpers.py unpack_fp4_from_uint8): its weights are lpjax's decode rounded to bf16.
- mxfp4-ct: compressed-tensors' `mxfp4-pack-quantized` (MXFP4A16): `<name>.weight_packed` uint8
  (out, in/2) and `<name>.weight_scale` uint8 E8M0 (out, in/32), strategy "group", group_size 32
  (compressed_tensors/compressors/mxfp4/base.py, mx_utils.py): a public reader of dense MXFP4.
- nvfp4: NVIDIA ModelOpt's layout: `<name>.weight` uint8 (out, in/2), `<name>.weight_scale`
  float8_e4m3fn (out, in/16) and `<name>.weight_scale_2` float32 scalar () = amax_t / 2688;
  quant_algo "W4A16_NVFP4" (weight-only: no `input_scale`; vLLM's modelopt loader,
  ModelOptNvFp4Config), or with `--calibration_batches=N` quant_algo "NVFP4" and each linear's
  `<name>.input_scale` float32 scalar () = activation amax / (6 * 448) (lpjax/models/
  _calibration.py), hf_quant_config.json with `quantization.exclude_modules`, and config.json's
  quantization_config with quant_method "modelopt" and the same list as "ignore".
- mxfp4: gpt-oss's naming, `<name>.weight_blocks` uint8 (out, in/32, 16) and
  `<name>.weight_scales` uint8 E8M0 (out, in/32); quant_method "mxfp4". Stock loaders convert
  only gpt-oss's expert modules in this naming, not a dense LLaMA's: use mxfp4-ct to serve one.
A 16x16 NVFP4 weight tile's scale is repeated for its 16 rows. Codes, block scales and amax_t are
the run's bits; a decoder that forms e2m1 * (s_b * weight_scale_2) (or s_b / global_scale) rounds
in another order than lpjax's e2m1 * ((s_b * amax_t) * fl32(1/2688)) (docs/numerics.md section 5),
so its float32 values can differ from the forward pass's by a few ulps.
`FORMATS` gives, per layout, the test a packed weight's format must pass and its packer.

Examples:
  >>> quantization_config("mxfp4", ["lm_head"])
  {'quant_method': 'mxfp4', 'modules_to_not_convert': ['lm_head']}
  >>> sorted(quantization_config("nvfp4", [], ["rht"])["lpjax_requantized"])
  ['values', 'why']
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from lpjax import quant

QUANT_LAYOUTS = ("mxfp4", "nvfp4", "nvfp4-ct", "mxfp4-ct")


def _pack_mxfp4(w: quant.PackedWeight) -> dict[str, np.ndarray]:
  out_dim, n_in = w.shape
  blocks = -(-n_in // 32)
  codes = np.zeros((out_dim, blocks * 16), np.uint8)
  codes[:, :w.codes.shape[1]] = w.codes
  return {"weight_blocks": codes.reshape(out_dim, blocks, 16),
          "weight_scales": np.asarray(w.scales, np.uint8)}


def _pack_nvfp4(w: quant.PackedWeight) -> dict[str, np.ndarray]:
  out_dim, n_in = w.shape
  scales = np.asarray(w.scales, np.uint8)
  if w.format.tile:  # one scale per 16x16 tile: the same for each of its 16 rows
    scales = np.repeat(scales, 16, axis=0)[:out_dim]
  amax = np.float32(w.tensor_scale)
  return {"weight": np.asarray(w.codes, np.uint8),
          "weight_scale": scales.view(ml_dtypes.float8_e4m3fn),
          "weight_scale_2": np.asarray(amax / np.float32(2688.0), np.float32)}


def _pack_nvfp4_ct(w: quant.PackedWeight) -> dict[str, np.ndarray]:
  t = _pack_nvfp4(w)
  amax = np.float32(w.tensor_scale)
  return {"weight_packed": t["weight"], "weight_scale": t["weight_scale"],
          "weight_global_scale": np.array([np.float32(2688.0) / amax], np.float32)}


def _pack_mxfp4_ct(w: quant.PackedWeight) -> dict[str, np.ndarray]:
  t = _pack_mxfp4(w)
  return {"weight_packed": t["weight_blocks"].reshape(w.shape[0], -1),
          "weight_scale": t["weight_scales"]}


_IS_MXFP4 = lambda f: (f.element.name, f.scale, f.block_size, f.tile, f.tensor_scale) == (
    "e2m1", "e8m0", 32, False, False)
_IS_NVFP4 = lambda f: (f.element.name, f.scale, f.block_size, f.tensor_scale) == (
    "e2m1", "ue4m3", 16, True)
FORMATS = {  # layout -> (what the format must be, packer)
    "mxfp4": (_IS_MXFP4, _pack_mxfp4),
    "nvfp4": (_IS_NVFP4, _pack_nvfp4),
    "nvfp4-ct": (_IS_NVFP4, _pack_nvfp4_ct),
    "mxfp4-ct": (_IS_MXFP4, _pack_mxfp4_ct),
}
NVFP4_WEIGHT_ONLY = "W4A16_NVFP4"  # ModelOpt's algorithm name of weight-only NVFP4
NVFP4_ACTIVATIONS = "NVFP4"  # ... of NVFP4 weights and activations (a calibrated input_scale)


def _compressed_tensors(fmt: str, kept: list[str]) -> dict:
  nv = fmt.startswith("nvfp4")
  weights = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16 if nv else 32,
             "strategy": "tensor_group" if nv else "group", "dynamic": False,
             "scale_dtype": "torch.float8_e4m3fn" if nv else "torch.uint8"}
  return {"quant_method": "compressed-tensors", "format": fmt,
          "quantization_status": "compressed", "global_compression_ratio": None,
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                        "input_activations": None, "output_activations": None,
                                        "format": fmt}},
          "ignore": kept, "kv_cache_scheme": None}


def hf_quant_config(config: dict) -> dict | None:
  """ModelOpt's hf_quant_config.json of an export's config.json (None for other layouts)."""
  qc = config.get("quantization_config") or {}
  if qc.get("quant_method") != "modelopt":
    return None
  return {"producer": {"name": "lpjax"},
          "quantization": {"quant_algo": qc["quant_algo"], "group_size": qc["group_size"],
                           "kv_cache_quant_algo": None, "exclude_modules": qc["ignore"]}}


def quantization_config(layout: str, kept: list[str], requantized: list[str] = (),
                        activations: bool = False) -> dict:
  """The `quantization_config` of config.json for `layout`, `kept`: the modules left in bf16;
  `requantized`: why packed weights are not the training forward's values (see
  `lpjax.models.hf_llama.export_tensors`), recorded under "lpjax_requantized" (absent when the
  packed values are the forward's); `activations`: nvfp4 with calibrated `input_scale`s
  (ModelOpt's "NVFP4") instead of weight-only "W4A16_NVFP4"."""
  if layout == "mxfp4":
    config = {"quant_method": "mxfp4", "modules_to_not_convert": kept}
  elif layout == "nvfp4":
    algo = NVFP4_ACTIVATIONS if activations else NVFP4_WEIGHT_ONLY
    config = {"quant_method": "modelopt", "quant_algo": algo, "group_size": 16,
              "ignore": kept, "kv_cache_quant_algo": None}
  else:
    config = _compressed_tensors(layout.replace("-ct", "-pack-quantized"), kept)
  if requantized:
    config["lpjax_requantized"] = {
        "values": "round-to-nearest-even of the trained weights in this format, NOT the values "
                  "the training forward pass multiplied",
        "why": sorted(set(requantized))}
  return config
