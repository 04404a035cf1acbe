"""lpjax.quant.formats: what a format is, as data (docs/numerics.md §1-3). Stands on `numerics`.

Modules, and what they offer to the rest of lpjax:
- `specs`: `ElementFormat`, `QuantFormat`, `get_format`, the preset table and the scale modes.
- `tables`: `decode_table`, the value of every code of an element format.
- `packing`: `pack_fp4` / `unpack_fp4`, two 4-bit codes per byte.
- `layout`: `GroupLayout`, how an array is cut into scaling groups.
"""
