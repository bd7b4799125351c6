"""Password hashing: argon2id through argon2-cffi, with its default parameters (RFC 9106's
second recommended option). A hash carries its parameters, so raising them later still
verifies old hashes; `needs_rehash` tells when one should be replaced."""

from __future__ import annotations

from functools import lru_cache

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

_HASHER = PasswordHasher()
MIN_LENGTH = 8


class WeakPassword(ValueError):
    pass


def hash_password(password: str) -> str:
    if len(password) < MIN_LENGTH:
        raise WeakPassword(f"a password needs at least {MIN_LENGTH} characters")
    return _HASHER.hash(password)


def verify(password_hash: str, password: str) -> bool:
    try:
        return _HASHER.verify(password_hash, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


def verify_nobody(password: str) -> None:
    """The work of one verification for a user name that does not exist, so that a
    sign-in's timing does not tell which names do."""
    verify(_dummy_hash(), password)


def valid_hash(password_hash: str) -> bool:
    return password_hash.startswith("$argon2")


@lru_cache(maxsize=1)
def _dummy_hash() -> str:
    return _HASHER.hash("not a password of anyone")
