"""Time-ordered task ids (UUIDv7 layout) so the primary key index stays append-mostly, and
increasing within a process, so tasks enqueued one after another (a batch included) are
claimed in that order when their priority and due time tie."""

import random
import threading
import time
import uuid

_VERSION_AND_VARIANT = (0x7 << 76) | (0b10 << 62)
_lock = threading.Lock()
_last = 0


def uuid7() -> uuid.UUID:
    # 48 bits of Unix milliseconds, then 74 random bits. Ids are not secrets: the process's
    # Mersenne Twister (reseeded after fork) is random enough and several times faster
    # than os.urandom, which matters for bulk enqueue. Within one millisecond the random
    # bits alone would order ids at random; instead an id never goes below the last one
    # plus one (RFC 9562's monotonic random method), so order follows the calls.
    global _last
    rand = random.getrandbits(74)
    value = (time.time_ns() // 1_000_000) << 74 | rand
    with _lock:
        if value <= _last:
            value = _last + 1
        _last = value
    # The 122 bits into the UUID layout: 48 time, version, 12 bits, variant, 62 bits.
    high, low = value >> 62, value & 0x3FFF_FFFF_FFFF_FFFF
    return uuid.UUID(int=(high >> 12) << 80 | (high & 0xFFF) << 64 | low | _VERSION_AND_VARIANT)
