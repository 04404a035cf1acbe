"""lpjax.train.cli: see the layer order in tests/test_architecture.py."""
