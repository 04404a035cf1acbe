"""lpjax.train.loop: see the layer order in tests/test_architecture.py."""
