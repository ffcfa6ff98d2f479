"""Sweeps over simulate options and capacity planning, on local processes or Ray."""
