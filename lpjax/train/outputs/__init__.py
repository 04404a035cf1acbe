"""lpjax.train.outputs: see the layer order in tests/test_architecture.py."""
