"""train.py's side of lpjax.train: the command line and the quick vision configs.

The top part: it may import any other part. Modules: `_cli` (`--config.x=y` overrides, flag
errors, the commands printed for the next step), `_vision_configs` (`vision_config`: a ResNet /
U-Net config with its task's recommended recipe and optimizer).
"""
