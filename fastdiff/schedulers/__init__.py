"""Samplers: presets over diffusers' schedulers (``catalog`` holds the presets as data, loading no torch)."""

__all__ = ["PRESETS", "Scheduler", "make_scheduler"]


def __getattr__(name: str):
    # loaded at first use: the command line reads fastdiff.schedulers.catalog without torch and diffusers
    if name in __all__:
        from fastdiff.schedulers import presets

        return getattr(presets, name)
    raise AttributeError(f"module 'fastdiff.schedulers' has no attribute {name!r}")
