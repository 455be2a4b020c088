"""DeepEP's ``deep_ep.utils`` names: ``deep_ep.utils.EventOverlap`` and ``EventHandle``."""
from .events import EventHandle, EventOverlap

__all__ = ["EventHandle", "EventOverlap"]
