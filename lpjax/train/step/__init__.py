"""lpjax.train.step: see the layer order in tests/test_architecture.py."""
