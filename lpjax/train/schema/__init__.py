"""The training config's schema and its checks: what a config may say, found wrong before
anything compiles (the bottom of lpjax.train; imports no other part of it).

Modules: `_config_schema` (every key of each task's configs, its default and meaning),
`_validate` (`validate(config, device_count)`: every problem of a config), `_validate_model_data`
(the model and data checks of `validate`), `_quant_rules` (the `quant.rules` grammar: per-path
recipes in one string), `_preflight` (the workdir and the loaded data, checked before compiling).
"""
