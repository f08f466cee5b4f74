"""Integers as the kernel prints them, checked before they are believed.

Python's int() takes what no kernel prints: "+7", " 7", "1_000", Arabic-Indic and other
Unicode digits, and any number of digits. A kernel field is ASCII digits (a minus sign
only where the kernel prints a signed type) and fits the C type it was printed from.
"""

from __future__ import annotations

U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1
S64_MIN, S64_MAX = -(1 << 63), (1 << 63) - 1
_MAX_DIGITS = 20  # len(str(U64_MAX)); longer text is refused before int() reads it


class KernelNumberError(ValueError):
    """Not a number the kernel could have printed in this field."""


def _digits(text: str | bytes) -> bool:
    return 0 < len(text) <= _MAX_DIGITS and text.isdigit() and text.isascii()


def u64(text: str | bytes) -> int:
    """An unsigned 64-bit field (%llu, %lu): ASCII digits, at most 2**64 - 1."""
    if _digits(text):
        value = int(text)
        if value <= U64_MAX:
            return value
    raise KernelNumberError(f"not an unsigned 64-bit number: {_show(text)}")


def s64(text: str | bytes) -> int:
    """A signed 64-bit field (%lld, %ld): an optional '-', then ASCII digits."""
    negative = text[:1] in ("-", b"-")
    if _digits(text[1:] if negative else text):
        value = int(text)
        if S64_MIN <= value <= S64_MAX:
            return value
    raise KernelNumberError(f"not a signed 64-bit number: {_show(text)}")


def _show(text: str | bytes) -> str:
    return repr(text[:32]) + ("..." if len(text) > 32 else "")
