"""lpjax.train.model: see the layer order in tests/test_architecture.py."""
