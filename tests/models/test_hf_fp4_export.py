"""Packed FP4 checkpoints out of lpjax (lpjax.models.hf_llama, MXFP4 and NVFP4 layouts), against
numpy decoders of the OCP MX (E2M1 codes, E8M0 scales) and NVFP4 (E2M1, E4M3 scales, FP32 tensor
scale) layouts written here from the format definitions, not lpjax's decoder. The bf16 and
import side: tests/models/test_hf_llama.py."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy")

from lpjax import quant  # noqa: E402
from lpjax.models import hf_llama, llama  # noqa: E402

HIDDEN, FFN, HEADS, LAYERS, VOCAB = 64, 96, 4, 2, 67

# --- packed FP4 -------------------------------------------------------------------------------


def _e2m1(codes: np.ndarray) -> np.ndarray:
  """OCP E2M1: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0; exponent 0 subnormal."""
  sign = np.where(codes & 8, -1.0, 1.0)
  e, m = (codes >> 1) & 3, codes & 1
  return sign * np.where(e == 0, m * 0.5, 2.0 ** (e.astype(np.float64) - 1) * (1 + m / 2))


def _unpack(packed: np.ndarray) -> np.ndarray:
  """Two codes a byte, element 2i in the low nibble."""
  return np.stack([packed & 0xF, packed >> 4], -1).reshape(*packed.shape[:-1], -1)


def _e4m3(byte: np.ndarray) -> np.ndarray:
  """OCP E4M3 (fn): exponent bits 6-3 (bias 7), mantissa bits 2-0; exponent 0 subnormal."""
  e, m = (byte >> 3) & 0xF, byte & 7
  return np.where(e == 0, m / 8 * 2.0**-6, 2.0 ** (e.astype(np.float64) - 7) * (1 + m / 8))


def _decode_mxfp4(t: dict, name: str) -> np.ndarray:
  blocks, scales = t[name + ".weight_blocks"], t[name + ".weight_scales"]
  assert blocks.dtype == np.uint8 and scales.dtype == np.uint8
  values = _e2m1(_unpack(blocks)).reshape(*scales.shape, 32)  # (out, in / 32, 32)
  scale = 2.0 ** (scales.astype(np.float64) - 127)  # E8M0
  return (values * scale[..., None]).reshape(scales.shape[0], -1).astype(np.float32)


def _decode_nvfp4(t: dict, name: str, amax: np.float32 | None = None):
  codes, scales = t[name + ".weight"], t[name + ".weight_scale"].view(np.uint8)
  ws2 = t[name + ".weight_scale_2"]
  assert codes.dtype == np.uint8 and ws2.dtype == np.float32 and ws2.shape == ()
  unit = (_e2m1(_unpack(codes)).reshape(*scales.shape, 16)
          * _e4m3(scales)[..., None]).astype(np.float32)  # exact: 2 x 4 significant bits
  if amax is None:  # the public two-level decode: codes * (block scale * weight_scale_2)
    return (unit * ws2).reshape(scales.shape[0], -1)
  # docs/numerics.md section 5: ((s_b * amax_t) * fl32(1/2688)) per block
  mult = ((_e4m3(scales).astype(np.float32) * amax) * np.float32(1 / 2688)).astype(np.float32)
  values = _e2m1(_unpack(codes)).reshape(*scales.shape, 16).astype(np.float32) * mult[..., None]
  return values.reshape(scales.shape[0], -1)


LINEAR = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def _trained(compute_dtype="float32"):
  cfg = llama.LlamaConfig(vocab_size=VOCAB, hidden=HIDDEN, intermediate=FFN, heads=HEADS,
                          layers=LAYERS, max_seq_len=32, compute_dtype=compute_dtype)
  params = llama.init_params(cfg, jax.random.key(5))
  return cfg, jax.tree.map(lambda a: a * jnp.linspace(0.5, 40.0, a.shape[-1]), params)


def _weight_t(cfg, params, i: int, module: str):
  """W^T (out, in) of block i's `module` in the compute dtype, as the forward GEMM gets it."""
  lp = {v: k for k, v in hf_llama._BLOCK.items()}[module]
  group, name = lp.split("/")
  return jnp.asarray(params["layers"][group][name]["kernel"][...][i]).astype(cfg.compute_dtype).T


@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_mxfp4_export_decodes_to_the_runs_fake_quant_bit_for_bit(compute_dtype):
  cfg, params = _trained(compute_dtype)
  policy = quant.QuantPolicy.from_settings("mxfp4_naive")
  config, t = hf_llama.export_tensors(cfg, params, layout="mxfp4", policy=policy)
  qc = config["quantization_config"]
  assert qc["quant_method"] == "mxfp4" and qc["modules_to_not_convert"] == ["lm_head"]
  assert t["model.embed_tokens.weight"].dtype == ml_dtypes.bfloat16
  op = quant.get_recipe("mxfp4_naive").fwd.rhs
  for i in range(LAYERS):
    for module in LINEAR:
      w_t = _weight_t(cfg, params, i, module)
      want = np.asarray(quant.fake_quant_operand(w_t, op, axis=-1), np.float32)
      got = _decode_mxfp4(t, f"model.layers.{i}.{module}")
      assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (i, module)


def test_nvfp4_export_codes_scales_and_tensor_scale_are_the_runs_bit_for_bit():
  cfg, params = _trained()
  policy = quant.QuantPolicy.from_settings("nvfp4")
  config, t = hf_llama.export_tensors(cfg, params, layout="nvfp4", policy=policy)
  qc = config["quantization_config"]
  # ModelOpt's weight-only variant: no input_scale is expected (vLLM's ModelOptNvFp4Config)
  assert (qc["quant_method"], qc["quant_algo"], qc["group_size"]) == (
      "modelopt", "W4A16_NVFP4", 16)
  assert qc["ignore"] == ["lm_head"] and not any(k.endswith("input_scale") for k in t)
  op = quant.get_recipe("nvfp4").fwd.rhs
  assert op.format.tile  # 16x16 weight tiles
  ulps = []
  for i in range(LAYERS):
    for module in LINEAR:
      name = f"model.layers.{i}.{module}"
      w_t = np.asarray(_weight_t(cfg, params, i, module))
      want = np.asarray(quant.fake_quant_operand(jnp.asarray(w_t), op, axis=-1), np.float32)
      amax = np.float32(np.abs(w_t).max())
      assert t[name + ".weight_scale_2"] == np.float32(amax / np.float32(2688))
      # each 16x16 tile has one scale: the 16 rows of a tile carry the same bytes
      s = t[name + ".weight_scale"].view(np.uint8)
      assert np.array_equal(s, np.repeat(s[::16], 16, axis=0))
      got = _decode_nvfp4(t, name, amax)
      assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), name
      public = _decode_nvfp4(t, name)
      ulps.append(np.abs(public.view(np.int32) - want.view(np.int32)).max())
  # the public two-level decode rounds s_b * (amax_t / 2688) where lpjax rounds
  # (s_b * amax_t) * (1 / 2688): two roundings in another order, at most two float32 ulps apart
  assert max(ulps) <= 2


def test_export_refuses_a_format_other_than_the_runs_and_a_rotated_forward():
  cfg, params = _trained()
  with pytest.raises(ValueError, match="What you train is what you serve"):
    hf_llama.export_tensors(cfg, params, layout="nvfp4",
                            policy=quant.QuantPolicy.from_settings("mxfp4_naive"))
  with pytest.raises(ValueError, match="Hadamard.*--allow_requantize"):
    hf_llama.export_tensors(cfg, params, layout="mxfp4",
                            policy=quant.QuantPolicy.from_settings("mxfp4"))


def _ocp_mxfp4_rtn(w_t: np.ndarray) -> np.ndarray:
  """numpy OCP MX v1.0 MXFP4 round-to-nearest-even of W^T (out, in) along `in`: per 32-block,
  scale 2^(floor(log2 amax) - 2) (E8M0), elements rounded to E2M1 (ties to even), saturating."""
  out, n = w_t.shape
  blocks = w_t.astype(np.float64).reshape(out, n // 32, 32)
  amax = np.abs(blocks).max(-1, keepdims=True)
  scale = np.exp2(np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 2)
  grid = np.array([0, .5, 1, 1.5, 2, 3, 4, 6])
  a = np.minimum(np.abs(blocks) / scale, 6.0)
  # nearest grid point; a tie goes to the even code (mantissa bit 0 = index even): a float32 / 2^k
  # that is no tie is at least 2^-21 from one, far more than the 1e-9 tie-breaker
  i = (np.abs(a[..., None] - grid) + 1e-9 * (np.arange(8) % 2)).argmin(-1)
  return (np.sign(blocks) * grid[i] * scale).reshape(out, n).astype(np.float32)


@pytest.mark.parametrize("recipe", ["mxfp4", "quartet"])
def test_allow_requantize_exports_ocp_rtn_of_the_trained_weights_and_records_it(recipe):
  """The `mxfp4` preset (RHT-32 in the forward) and quartet (QuEST after H-32): their forward
  weights live in a rotated basis; with requantize the export is the OCP round-to-nearest of W,
  decoded by the independent numpy decoder, and config.json says the values are not the
  forward's."""
  cfg, params = _trained()
  policy = quant.QuantPolicy.from_settings(recipe, high_precision="bf16")
  with pytest.warns(UserWarning, match="requantized"):
    config, t = hf_llama.export_tensors(cfg, params, layout="mxfp4", policy=policy,
                                        requantize=True)
  qc = config["quantization_config"]
  assert qc["quant_method"] == "mxfp4" and qc["modules_to_not_convert"] == ["lm_head"]
  record = qc["lpjax_requantized"]
  assert "NOT the values" in record["values"] and record["why"][0].startswith(recipe)
  for i in range(LAYERS):
    for module in LINEAR:
      w_t = np.asarray(_weight_t(cfg, params, i, module))
      got = _decode_mxfp4(t, f"model.layers.{i}.{module}")
      assert np.array_equal(got, _ocp_mxfp4_rtn(w_t)), (i, module)
  # without requantize the export refuses; an exact recipe records nothing
  assert "lpjax_requantized" not in hf_llama.export_tensors(
      cfg, params, layout="mxfp4", policy=quant.QuantPolicy.from_settings("mxfp4_naive"),
      requantize=True)[0]["quantization_config"]


@pytest.mark.parametrize("layout,recipe,low,high", [("mxfp4", "mxfp4_naive", 0.26, 0.275),
                                                    ("nvfp4", "nvfp4", 0.275, 0.29)])
def test_packed_linear_weights_are_about_a_quarter_of_bf16(layout, recipe, low, high):
  cfg, params = _trained()
  _, bf16 = hf_llama.export_tensors(cfg, params, layout="bf16")
  _, packed = hf_llama.export_tensors(cfg, params, layout=layout,
                                      policy=quant.QuantPolicy.from_settings(recipe))
  linear = lambda t: sum(a.nbytes for k, a in t.items() if any(m in k for m in LINEAR))
  ratio = linear(packed) / linear(bf16)
  assert low < ratio < high, ratio
