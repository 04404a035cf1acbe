"""Experiment configs: one file per experiment; each docstring gives its command."""
