"""Grouped KV heads and tied embeddings under a sharded mesh: an MXFP4 GQA, tied LLaMA on a
data x fsdp x tensor mesh (FP4 weights gathered under FSDP; the k / v kernels narrower than q's,
the tied head the embedding table's transpose) gives the 1-device losses."""

import jax
import numpy as np

from config_helpers import small
from lpjax.train.loop._trainer import Trainer

GQA = {"model.num_kv_heads": 2, "model.tie_embeddings": True}


def test_a_gqa_tied_fp4_model_on_a_three_axis_mesh_matches_one_device(tmp_path):
  one = Trainer(small("mxfp4_naive", steps=2, **GQA, **{"mesh.data": 1}), str(tmp_path / "one"),
                devices=jax.devices()[:1]).run()
  trainer = Trainer(small("mxfp4_naive", steps=2, **GQA, **{"mesh.data": 2, "mesh.fsdp": 2,
                                                             "mesh.tensor": 2}),
                    str(tmp_path / "mesh"))
  three = trainer.run()
  k = trainer.final_state.params["layers"]["attn"]["k_proj"]["kernel"][...]
  assert k.shape == (4, 128, 64) and k.sharding.spec[1:] == ("fsdp", "tensor")
  assert "lm_head" not in trainer.final_state.params
  for key in ("final_train_loss", "final_eval_loss"):
    np.testing.assert_allclose(three[key], one[key], rtol=1e-5)
