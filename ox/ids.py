"""Time-ordered task ids (UUIDv7 layout) so the primary key index stays append-mostly."""

import os
import time
import uuid


def uuid7() -> uuid.UUID:
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & 0xFFFF_FFFF_FFFF) << 80
    value |= 0x7 << 76  # version
    value |= (rand >> 68) << 64 & (0xFFF << 64)  # 12 random bits (rand_a)
    value |= 0b10 << 62  # variant
    value |= rand & 0x3FFF_FFFF_FFFF_FFFF  # 62 random bits (rand_b)
    return uuid.UUID(int=value)
