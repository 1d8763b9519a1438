"""The in-process memory backings: the semantic reference for every other backing.

Each protocol's memory implementation is the behaviour the conformance suites
pin down; a Redis or PostgreSQL backing that disagrees with it is wrong. State
lives in this process and is lost when it exits; nothing here is safe across
processes or OS threads, and nothing here may import a driver.
"""

from statepact.settings import MemoryStoreSettings
from statepact.storage.memory.backend import MemoryBackend
from statepact.storage.memory.backing import open_backing
from statepact.storage.memory.queue import MemoryWorkQueue
from statepact.storage.memory.state import MemoryStateStore

# The transaction backing (MemoryBackend) is imported here too, from .backend.

__all__ = [
    "MemoryBackend",
    "MemoryStateStore",
    "MemoryStoreSettings",
    "MemoryWorkQueue",
    "open_backing",
]
