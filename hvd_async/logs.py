"""Logging with the rank in every line; the level comes from HVD_ASYNC_LOG_LEVEL (default WARNING)."""
import logging
import os

_FORMAT = "%(asctime)s [%(role)s %(rank)s] %(name)s %(levelname)s: %(message)s"


class _RankFilter(logging.Filter):
    def __init__(self, role: str, rank: int):
        super().__init__()
        self.role, self.rank = role, rank

    def filter(self, record):
        record.role, record.rank = self.role, self.rank
        return True


def configure(role: str = "proc", rank: int = 0) -> None:
    """Send ``hvd_async`` log records to stderr, tagged with this process's role and rank."""
    logger = logging.getLogger("hvd_async")
    level = os.environ.get("HVD_ASYNC_LOG_LEVEL", "WARNING").upper()
    logger.setLevel(getattr(logging, level, logging.WARNING))
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler.addFilter(_RankFilter(role, rank))
    logger.addHandler(handler)
    logger.propagate = False
