"""Examples of your own model in lpjax's trainer (`--config.model.factory`); see
docs/your_own_model.md."""
