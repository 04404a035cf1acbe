"""lpjax.train.state: see the layer order in tests/test_architecture.py."""
