"""lpjax.train.schema: see the layer order in tests/test_architecture.py."""
