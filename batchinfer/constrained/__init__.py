"""Constrained output: what a request asks its completion to be (spec), the grammar masks that keep
generation inside it, and the per-request hook those masks and seeded sampling share in continuous batching."""
