"""Mesh shardings: parameters by their logical axes, activations by the model's hints."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec

from config_helpers import small
from lpjax.nn import _sharding_hints as sharding_hints
from lpjax.train.step import _sharding as shd
from lpjax.train.loop._trainer import Trainer


def test_activation_resolver_maps_logical_axes_onto_the_mesh():
  mesh = shd.make_mesh(data=2, fsdp=2, tensor=2)
  resolve = shd.activation_resolver(mesh)
  # the batch is split over data and fsdp; MLP units over tensor; the residual stream replicated
  assert resolve(("batch", "length", "act_mlp"), (8, 4, 6)).spec == PartitionSpec(
      ("data", "fsdp"), None, "tensor")
  assert resolve(("batch", "length", "act_embed"), (8, 4, 6)).spec == PartitionSpec(
      ("data", "fsdp"), None, None)
  assert resolve(("length", None), (4, 6)) is None  # no batch axis: left to XLA
  # a batch the devices do not divide stays replicated instead of failing
  assert resolve(("batch", "length"), (3, 4)).spec == PartitionSpec(None, None)


def test_constrain_checks_the_rank():
  with sharding_hints.activation_sharding(lambda axes, shape: None):
    with pytest.raises(ValueError, match="rank 2"):
      sharding_hints.constrain(jnp.ones((2, 3)), ("batch",))


def _compiled_step_text(trainer):
  state = trainer.init_state()
  c = trainer.config
  tokens = jax.ShapeDtypeStruct((c.batch_size, c.seq_len), jnp.int32,
                                sharding=trainer.batch_sharding)
  return trainer.train_step(None).lower(state, {"inputs": tokens, "targets": tokens},
                                        jax.random.key(0)).compile().as_text()


@pytest.mark.parametrize("hints", [True, False])
def test_fsdp_keeps_each_devices_rows(tmp_path, monkeypatch, hints):
  """Under fsdp (weights and batch both over `fsdp`) every device computes only its own rows.

  Without the hints XLA computed the logits of the whole microbatch on every device (8x the
  activation memory and FLOPs); the `hints=False` case shows the test can tell.
  """
  if not hints:  # no activation hints, and no pinned GEMM operands (lpjax.quant.weight_sharding)
    monkeypatch.setattr(shd, "activation_resolver", lambda mesh: None)
    monkeypatch.setattr(shd, "weight_resolver", lambda mesh: None)
  cfg = small("fp32", **{"mesh.data": 1, "mesh.fsdp": 8, "batch_size": 16,
                         "grad_accum_steps": 2, "model.vocab_size": 384})
  text = _compiled_step_text(Trainer(cfg, str(tmp_path)))
  # logits of the whole microbatch (8 rows of 32 tokens, maybe flattened) vs one device's row
  whole = ("f32[8,32,384]" in text) or ("f32[256,384]" in text)
  if hints:
    assert "f32[1,32,384]" in text and not whole
  else:
    assert whole


def test_data_fsdp_tensor_mesh_matches_one_device(tmp_path):
  """A 2 x 2 x 2 mesh (heads, MLP units and vocabulary over `tensor`) gives the 1-device losses."""
  import numpy as np

  one = Trainer(small("fp32", steps=2, **{"mesh.data": 1}), str(tmp_path / "one"),
                devices=jax.devices()[:1]).run()
  trainer = Trainer(small("fp32", steps=2, **{"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2}),
                    str(tmp_path / "three_axes"))
  three = trainer.run()
  kernel = trainer.final_state.params["layers"]["mlp"]["up_proj"]["kernel"][...]
  assert kernel.sharding.spec[1:] == ("fsdp", "tensor")  # (layers, embed, mlp)
  for key in ("final_train_loss", "final_eval_loss", "final_eval_loss_fp"):
    np.testing.assert_allclose(three[key], one[key], rtol=1e-5)


def test_llama_kernel_axes_match_the_partition_rules():
  """The logical axes a LLaMA layer hands its GEMM (for the FP4 weight gather) are its kernel's."""
  from flax import nnx
  from lpjax.models import llama

  cfg = llama.LlamaConfig.from_size("tiny", vocab_size=256, max_seq_len=32)
  model = nnx.eval_shape(lambda: llama.Llama(cfg, rngs=nnx.Rngs(params=0)))
  seen = 0
  for path, module in model.iter_modules():
    axes = getattr(module, "kernel_axes", None)
    if axes is None:
      continue
    path = "/".join(str(p) for p in path) + "/kernel"
    assert (None,) + axes == shd.logical_axes_for(path, 3, llama.PARTITION_RULES) or (
        axes == shd.logical_axes_for(path, 2, llama.PARTITION_RULES)), path
    seen += 1
  assert seen == 8  # q, k, v, o, gate, up, down (one scanned block) and the LM head


def test_fp4_weight_gather_keeps_the_training_bits(tmp_path):
  """quant.gather_quantized_weights (FSDP gathers codes + scales): one train step, bit-identical
  loss, gradient norm and new parameters, and the compiled step gathers uint8."""
  import numpy as np

  out = {}
  for on in (False, True):
    cfg = small("mxfp4", **{"mesh.data": 1, "mesh.fsdp": 8, "batch_size": 16,
                            "quant.gather_quantized_weights": on})
    trainer = Trainer(cfg, str(tmp_path / str(on)))
    state = trainer.init_state()
    tokens = jax.device_put(np.random.default_rng(0).integers(0, 256, (16, 32), dtype=np.int32),
                            trainer.batch_sharding)
    batch = {"inputs": tokens, "targets": tokens}
    # the step compiled once: its HLO is read and the same executable makes the update
    compiled = trainer.train_step(None).lower(state, batch, jax.random.key(0)).compile()
    text = compiled.as_text()
    new_state, metrics = compiled(state, batch, jax.random.key(0))
    out[on] = (text, metrics, jax.tree.leaves(new_state.params))
  assert "u8[" in "".join(l for l in out[True][0].splitlines() if " all-gather(" in l)
  assert "u8[" not in "".join(l for l in out[False][0].splitlines() if " all-gather(" in l)
  for name in ("loss", "grad_norm"):
    assert float(out[True][1][name]) == float(out[False][1][name]), name
  for a, b in zip(out[True][2], out[False][2]):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_vocab_chunks_gather_the_lm_head_once(tmp_path):
  """Under fsdp the vocab-chunked loss gathers the LM head once per microbatch, like the whole-
  logits loss, not once per vocabulary slice in the forward and again in its recomputation."""
  import os
  import sys
  sys.path[:0] = [os.path.join(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))), "benchmarks"), d)
                  for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/
  from hlo_collectives import collective_bytes

  def gathered(chunks):
    cfg = small("mxfp4_naive", **{"mesh.data": 1, "mesh.fsdp": 8, "batch_size": 16,
                                  "grad_accum_steps": 2, "model.vocab_size": 4096,
                                  "model.vocab_chunks": chunks})
    return sum(collective_bytes(_compiled_step_text(Trainer(cfg, str(tmp_path / str(chunks)))),
                                "all-gather").values())

  whole, chunked = gathered(0), gathered(8)
  assert chunked <= whole, (chunked, whole)
