"""The packed FP4 layouts of a Hugging Face export: each linear weight's tensors, config.json's
`quantization_config`.

`QUANT_LAYOUTS` are the public FP4 layouts lpjax exports; each takes the packed weights of
`lpjax.quant.export_weights` (the codes and scales the run's forward GEMMs multiplied) as they are:
- mxfp4: `<name>.weight_blocks` uint8 (out, in/32, 16), two E2M1 codes a byte (element 2i the
  low nibble), and `<name>.weight_scales` uint8 E8M0 (out, in/32), as gpt-oss's `*_blocks` /
  `*_scales`; quant_method "mxfp4".
- nvfp4: `<name>.weight` uint8 (out, in/2) packed E2M1, `<name>.weight_scale` float8_e4m3fn
  (out, in/16) and `<name>.weight_scale_2` float32 () = amax_t / 2688, as NVIDIA ModelOpt's
  checkpoints; quant_method "modelopt", quant_algo "NVFP4". A 16x16 weight tile's scale is
  repeated for its 16 rows. Codes, block scales and amax_t are the run's bits; a decoder that
  forms e2m1 * (s_b * weight_scale_2) rounds in another order than lpjax's
  e2m1 * ((s_b * amax_t) * fl32(1/2688)) (docs/numerics.md section 5), so its float32 values can
  differ from the forward pass's by up to two ulps.
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

QUANT_LAYOUTS = ("mxfp4", "nvfp4")


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


FORMATS = {  # layout -> (what the format must be, packer)
    "mxfp4": (lambda f: (f.element.name, f.scale, f.block_size, f.tile, f.tensor_scale)
              == ("e2m1", "e8m0", 32, False, False), _pack_mxfp4),
    "nvfp4": (lambda f: (f.element.name, f.scale, f.block_size, f.tensor_scale)
              == ("e2m1", "ue4m3", 16, True), _pack_nvfp4),
}


def quantization_config(layout: str, kept: list[str], requantized: list[str] = ()) -> dict:
  """The `quantization_config` of config.json for `layout`, `kept`: the modules left in bf16;
  `requantized`: why packed weights are not the training forward's values (see
  `lpjax.models.hf_llama.export_tensors`), recorded under "lpjax_requantized" (absent when the
  packed values are the forward's)."""
  if layout == "mxfp4":
    config = {"quant_method": "mxfp4", "modules_to_not_convert": kept}
  else:
    config = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
              "exclude_modules": kept, "kv_cache_quant_algo": None}
  if requantized:
    config["lpjax_requantized"] = {
        "values": "round-to-nearest-even of the trained weights in this format, NOT the values "
                  "the training forward pass multiplied",
        "why": sorted(set(requantized))}
  return config
