"""Experiments: one module per benchmark, each returning a tidy table."""
