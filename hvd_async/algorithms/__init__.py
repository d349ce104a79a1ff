"""When and what to exchange: one strategy per algorithm of the registry."""
from .base import Strategy, parse_options

__all__ = ["Strategy", "parse_options"]
