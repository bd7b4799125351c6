"""What a failed insert says about the rows, as far as the error alone can tell.

A data error is the rows' own: the same rows fail whatever the retries, so they are
isolated at once (collector.isolation). Anything else may be the store's availability or
the rows; the writer decides that by probing the store, never from one batch's error, so
a batch the store refuses cannot hold up the batches behind it (collector.writer).
"""

from __future__ import annotations

import struct

from clickhouse_connect.driver.exceptions import DatabaseError, DataError, ProgrammingError

# ClickHouse error codes that name the data of an insert (src/Common/ErrorCodes.cpp).
DATA_ERROR_CODES = frozenset({
    6,    # CANNOT_PARSE_TEXT
    26,   # CANNOT_PARSE_QUOTED_STRING
    27,   # CANNOT_PARSE_INPUT_ASSERTION_FAILED
    32,   # ATTEMPT_TO_READ_AFTER_EOF (a length that runs past its message)
    33,   # CANNOT_READ_ALL_DATA
    36,   # BAD_ARGUMENTS (the protobuf reader on two members of one oneof)
    38,   # CANNOT_PARSE_DATE
    41,   # CANNOT_PARSE_DATETIME
    53,   # TYPE_MISMATCH
    69,   # ARGUMENT_OUT_OF_BOUND
    70,   # CANNOT_CONVERT_TYPE
    72,   # CANNOT_PARSE_NUMBER
    117,  # INCORRECT_DATA
    131,  # TOO_LARGE_STRING_SIZE
    321,  # VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
    349,  # CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
    436,  # PROTOBUF_BAD_CAST (a value its schema field cannot hold)
    444,  # UNKNOWN_PROTOBUF_FORMAT
    469,  # VIOLATED_CONSTRAINT
})


# Codes that name the store's state, which no row can cause (a table detached or
# missing, a read-only replica, a full disk, too many parts waiting for merges): the
# writer waits for the store, and never blames the rows.
STORE_ERROR_CODES = frozenset({
    60,   # UNKNOWN_TABLE
    81,   # UNKNOWN_DATABASE
    164,  # READONLY
    202,  # TOO_MANY_SIMULTANEOUS_QUERIES
    218,  # TABLE_IS_DROPPED
    242,  # TABLE_IS_READ_ONLY
    243,  # NOT_ENOUGH_SPACE
    252,  # TOO_MANY_PARTS (the per-insert partition cap is lifted: collector.writer)
    279,  # ALL_CONNECTION_TRIES_FAILED
    319,  # UNKNOWN_STATUS_OF_INSERT
    999,  # KEEPER_EXCEPTION
})


def is_store_error(exc: BaseException) -> bool:
    """True when `exc` names the store's state, never the rows'."""
    return isinstance(exc, DatabaseError) and getattr(exc, "code", None) in STORE_ERROR_CODES


class RowsNotEncodable(DataError):
    """The driver could not encode the rows for the wire (a value its column type cannot
    hold): raised before anything reached the store."""


# What the driver's column encoders raise on a value they cannot write; marked where
# the insert is made (collector.writer), so nothing further down catches builtins.
ENCODE_ERRORS: tuple[type[Exception], ...] = (TypeError, ValueError, OverflowError, struct.error)


def is_data_error(exc: BaseException) -> bool:
    """True when `exc` says the rows themselves cannot be stored as they are."""
    if isinstance(exc, (DataError, ProgrammingError)):
        return True
    return isinstance(exc, DatabaseError) and getattr(exc, "code", None) in DATA_ERROR_CODES


def describe(exc: BaseException) -> str:
    """One line for logs, quarantine notes and client answers."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:500]}"
