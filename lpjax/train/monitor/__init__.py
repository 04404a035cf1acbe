"""lpjax.train.monitor: see the layer order in tests/test_architecture.py."""
