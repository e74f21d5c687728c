"""Parsed file texts (job scripts, configs, job.yaml) remembered by content, for the long-lived MCP server.

An assistant validates the same job again and again (after each fix, before each launch): the server re-read
and re-parsed every script and config each time, and parsing (the shell statement splitter, the JSON/YAML
line maps) was most of a validate_configs call. The key is the text itself, not a path and mtime: a file
rewritten within the filesystem's timestamp granularity, or replaced by another of the same size, can never
be answered from a stale parse. Each caller gets its own copy, so a rule that adds to what it was given
(gpt_args merged into a launch's flags) cannot change what the next call reads. One-shot CLI runs parse each
text once either way.
"""

from __future__ import annotations

import pickle
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")

MAX_ENTRIES = 256  # a few jobs' files
MAX_TEXT = 256 * 1024  # a dataset index past this is parsed each time, not held in memory

_cache: OrderedDict[Hashable, bytes] = OrderedDict()
_lock = threading.Lock()  # tool calls run in worker threads


def remembered(kind: str, key: Hashable, text: str, parse: Callable[[], T]) -> T:
    """`parse()`'s result for this text, from an earlier call with the same `kind`, `key` and text when
    there was one; always a fresh copy the caller may change. Kept pickled: unpickling is one C-speed call,
    several times faster than `copy.deepcopy` of the same dicts and dataclasses."""
    if len(text) > MAX_TEXT:
        return parse()
    full = (kind, key, text)
    with _lock:
        kept = _cache.get(full)
        if kept is not None:
            _cache.move_to_end(full)
    if kept is not None:
        loaded: T = pickle.loads(kept)  # (bytes this process pickled itself)
        return loaded
    parsed = parse()
    try:
        kept = pickle.dumps(parsed, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError):
        return parsed  # not picklable: parsed each time, as before
    with _lock:
        _cache[full] = kept
        while len(_cache) > MAX_ENTRIES:
            _cache.popitem(last=False)
    return parsed  # (this one is the caller's own: what is kept is the pickle)
