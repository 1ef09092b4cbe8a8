"""Guidance accelerators: classifier-free guidance only where it matters."""
