"""benchmarks/memory/hlo_collectives.py: bytes of the collectives of compiled HLO, times loop trips."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path[:0] = [os.path.join(os.path.join(ROOT, "benchmarks"), d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/

from hlo_collectives import collective_bytes  # noqa: E402


def test_nested_loops_multiply_and_async_starts_count_their_result():
  hlo = """
%inner (p: (s32[], f32[2])) -> (s32[], f32[2]) {
  %a = bf16[16,8]{1,0} all-gather(%x), dimensions={0}
  %s = (u8[4,8]{1,0}, u8[32,8]{1,0}) all-gather-start(%y), dimensions={0}
}
%outer (p: (s32[], f32[2])) -> (s32[], f32[2]) {
  %w = (s32[], f32[2]) while(%t), condition=%c, body=%inner, backend_config={"known_trip_count":{"n":"3"}}
}
ENTRY %main (a: f32[2]) -> f32[2] {
  %w0 = (s32[], f32[2]) while(%t), condition=%c, body=%outer, backend_config={"known_trip_count":{"n":"5"}}
  %r = f32[10]{0} all-reduce(%z), to_apply=%sum
}
"""
  assert collective_bytes(hlo, "all-gather") == {"bf16": 16 * 8 * 2 * 15, "u8": 32 * 8 * 15}
  assert collective_bytes(hlo, "all-reduce") == {"f32": 40}


def test_a_compiled_scan_of_gathers():
  mesh = Mesh(np.array(jax.devices()), ("d",))
  w = jax.device_put(jnp.ones((8, 64, 4), jnp.float32), NamedSharding(mesh, P(None, "d", None)))

  def f(w):
    def body(c, wi):
      full = jax.lax.with_sharding_constraint(wi, NamedSharding(mesh, P()))
      return c + full.sum(), None
    return jax.lax.scan(body, jnp.float32(0), w)[0]

  text = jax.jit(f).lower(w).compile().as_text()
  # one gathered (64, 4) float32 slice per step of the 8-step scan
  assert collective_bytes(text, "all-gather") == {"f32": 8 * 64 * 4 * 4}
