"""Layer 4, Gaussian blocks: a Gaussian latent kept as prior + sites, and its solvers."""

from .gaussian_block import BlockPosterior, GaussianBlock, find_block

__all__ = ["BlockPosterior", "GaussianBlock", "find_block"]
