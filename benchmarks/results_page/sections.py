"""Every results file's section, in results-page order (the groups of ``section.GROUPS``, in turn)."""

from __future__ import annotations

from . import (
    renderers_caching,
    renderers_compression,
    renderers_distill_tune,
    renderers_flow,
    renderers_gpu,
    renderers_parallel,
    renderers_samplers,
    renderers_serving,
    renderers_video,
)
from .section import Section

SECTIONS: dict[str, Section] = {
    **renderers_samplers.SECTIONS,
    **renderers_caching.SECTIONS,
    **renderers_compression.SECTIONS,
    **renderers_distill_tune.SECTIONS,
    **renderers_flow.SECTIONS,
    **renderers_video.SECTIONS,
    **renderers_parallel.SECTIONS,
    **renderers_serving.SECTIONS,
    **renderers_gpu.SECTIONS,
}
