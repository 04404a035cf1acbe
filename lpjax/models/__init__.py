"""lpjax.models: LLaMA (and, later, ResNet and a diffusion U-Net) built from lpjax.nn layers."""
