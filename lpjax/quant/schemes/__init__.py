"""lpjax.quant.schemes: the quantizers of published FP4 recipes, on top of `codec`.

Modules, and what they offer to the rest of lpjax:
- `hadamard`: the random Hadamard transform (`hadamard`, `hadamard_matrix`, `random_signs`,
  `fwht`); lpjax.pallas's RHT kernels match it bit for bit.
- `quest`: QuEST, Quartet's forward quantizer.
- `nvfp4`: NVFP4 "Four over Six" block scales and MS-EDEN.
- `ssp`: the Stable-SPAM paper's W4A4 fake quantizers.
"""
