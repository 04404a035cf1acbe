"""ModelOpt NVFP4 with calibrated activations (python -m lpjax.export --format=nvfp4
--calibration_batches=N): each packed linear gets a float32 scalar `input_scale` = its input's
amax over the run's first N training batches / (6 * 448), checked against an independent numpy
forward of the run's weights over the trainer's own batches; quant_algo "NVFP4" in config.json
and hf_quant_config.json. N <= 0, or the flag with another format, is one clear error."""

import json

import jax
import numpy as np
import pytest

pytest.importorskip("safetensors")

from config_helpers import config_file, override  # noqa: E402
from lpjax import export as lpexport  # noqa: E402
from lpjax import quant  # noqa: E402
from lpjax.models import hf_llama, llama  # noqa: E402
from lpjax.train.tasks import make_task  # noqa: E402

N = 2
CFG = llama.LlamaConfig(vocab_size=257, hidden=64, intermediate=96, heads=4, layers=2,
                        max_seq_len=16, num_kv_heads=2)


@pytest.fixture
def run(monkeypatch):
  """(config, params) of an NVFP4 run of a tiny GQA LLaMA on the byte corpus, handed to the
  export as its newest checkpoint (load_run stubbed: no training, no compile of a step)."""
  config = override(config_file("llama_tiny_mxfp4"), batch_size=8, seq_len=16,
                    **{"data.prefetch": 0, "quant.recipe": "nvfp4"})
  params = llama.init_params(CFG, jax.random.key(0))
  policy = quant.QuantPolicy.from_settings("nvfp4")
  monkeypatch.setattr(lpexport, "load_run", lambda workdir: (CFG, params, policy, 1, config))
  return config, params


def _rms(x, w, eps):
  return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def _rope(x, theta):  # (B, L, H, D), half-split
  d = x.shape[-1]
  freqs = 1.0 / theta ** (np.arange(0, d // 2) * 2.0 / d)
  ang = np.arange(x.shape[1])[:, None] * freqs[None]
  cos, sin = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]
  x1, x2 = x[..., :d // 2], x[..., d // 2:]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _input_amax(params, cfg, batches):
  """{HF module: max |input|}: a float64 numpy LLaMA forward, not lpjax's."""
  p = lambda *k: np.asarray(_get(params, k), np.float64)
  amax = {}
  note = lambda name, x: amax.__setitem__(name, max(amax.get(name, 0.0), np.abs(x).max()))
  hd = cfg.hidden // cfg.heads
  for tokens in batches:
    x = p("embed", "embedding")[tokens]
    b, length, _ = x.shape
    for i in range(cfg.layers):
      w = lambda *k: p("layers", *k)[i]
      pre = f"model.layers.{i}."
      h = _rms(x, w("attn_norm", "scale"), cfg.norm_eps)
      for proj in ("q_proj", "k_proj", "v_proj"):
        note(pre + "self_attn." + proj, h)
      q = _rope((h @ w("attn", "q_proj", "kernel")).reshape(b, length, cfg.heads, hd), cfg.rope_theta)
      k = _rope((h @ w("attn", "k_proj", "kernel")).reshape(b, length, -1, hd), cfg.rope_theta)
      v = (h @ w("attn", "v_proj", "kernel")).reshape(b, length, -1, hd)
      group = cfg.heads // k.shape[2]
      k, v = np.repeat(k, group, 2), np.repeat(v, group, 2)
      s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd)
      s = np.where(np.tril(np.ones((length, length), bool)), s, -np.inf)
      prob = np.exp(s - s.max(-1, keepdims=True))
      prob /= prob.sum(-1, keepdims=True)
      o = np.einsum("bhqk,bkhd->bqhd", prob, v).reshape(b, length, -1)
      note(pre + "self_attn.o_proj", o)
      x = x + o @ w("attn", "o_proj", "kernel")
      h = _rms(x, w("mlp_norm", "scale"), cfg.norm_eps)
      note(pre + "mlp.gate_proj", h)
      note(pre + "mlp.up_proj", h)
      g, u = h @ w("mlp", "gate_proj", "kernel"), h @ w("mlp", "up_proj", "kernel")
      act = g / (1 + np.exp(-g)) * u
      note(pre + "mlp.down_proj", act)
      x = x + act @ w("mlp", "down_proj", "kernel")
  return amax


def _get(params, keys):
  for k in keys:
    params = params[k]
  return params[...]


def test_input_scale_is_the_numpy_amax_over_the_run_s_batches_over_6_times_448(run, tmp_path):
  config, params = run
  out = tmp_path / "nv"
  assert lpexport.main([f"--workdir={tmp_path}", f"--out={out}", "--format=nvfp4",
                        f"--calibration_batches={N}"]) == 0
  tensors = hf_llama.read_tensors(str(out))
  # the trainer's own first N batches (steps 0 .. N-1)
  batches = [np.asarray(b["inputs"]) for _, b in make_task(config).batches(0, N, 0, 1)]
  assert len(batches) == N and batches[0].shape == (8, 16)
  want = _input_amax(params, CFG, batches)
  assert len(want) == 7 * CFG.layers
  for module, amax in want.items():
    got = tensors[module + ".input_scale"]
    assert got.dtype == np.float32 and got.shape == ()
    assert tensors[module + ".weight_scale_2"].shape == ()
    np.testing.assert_allclose(got, amax / (6 * 448), rtol=1e-5)
  one = _input_amax(params, CFG, batches[:1])  # the batches count: fewer give other scales
  assert any(one[m] < want[m] * (1 - 1e-3) for m in want)
  for name in ("config.json", "hf_quant_config.json"):
    with open(out / name) as f:
      q = json.load(f)
    algo = q["quantization_config"] if name == "config.json" else q["quantization"]
    assert algo["quant_algo"] == "NVFP4"
  # without the flag: weight-only, no input_scale
  assert lpexport.main([f"--workdir={tmp_path}", f"--out={tmp_path / 'w'}", "--format=nvfp4"]) == 0
  weight_only = hf_llama.read_tensors(str(tmp_path / "w"))
  assert not [k for k in weight_only if k.endswith("input_scale")]
  with open(tmp_path / "w" / "hf_quant_config.json") as f:
    assert json.load(f)["quantization"]["quant_algo"] == "W4A16_NVFP4"


@pytest.mark.parametrize("args,match", [
    (["--format=nvfp4", "--calibration_batches=0"], "positive number of training batches"),
    (["--format=nvfp4", "--calibration_batches=-3"], "positive number of training batches"),
    (["--format=nvfp4-ct", "--calibration_batches=4"], "weight-only: leave it out")])
def test_a_bad_calibration_batches_is_one_clear_error(tmp_path, capsys, args, match):
  assert lpexport.main([f"--workdir={tmp_path}", f"--out={tmp_path / 'o'}", *args]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and match in err[0] and "--calibration_batches" in err[0]
