"""The collector's one error vocabulary: permanent (the data's fault) or availability.

A data error is marked where it is raised: the decoder and the mappings raise a
PermanentError (mapping.decode.PayloadError), the sink marks what the driver's encoder
refuses (RowsNotEncodable), and the store names the rows with its error code
(DATA_ERROR_CODES). The same data fails whatever the retries, so it is answered 400 or
isolated at once (pipeline.isolation). Everything else is availability: the client keeps
its data and retries, and a failed insert whose error names neither is decided by probing
the store, never from one batch's error, so a batch the store refuses cannot hold up the
batches behind it (pipeline.retry). A builtin TypeError or ValueError is never read as bad
data: from our own code it is a bug, and a bug answers 503, not 400 and a quarantine.

Error codes come from the driver: clickhouse-connect gives every store error its numeric
ClickHouse code (`code`, also for the embedded engine), so nothing here reads a message.

`answer()` is the one table both receivers turn an exception into (gRPC code, HTTP
status, Retry-After) with.
"""

from __future__ import annotations

from dataclasses import dataclass

from clickhouse_connect.driver.exceptions import DatabaseError, DataError
from google.rpc import code_pb2

RETRY_AFTER_SECONDS = 1


class PermanentError(Exception):
    """The request's own data cannot be taken, whatever the retries. Subclasses may name
    an HTTP `status` of their own (413: too large)."""

    status = 400


class Unauthenticated(PermissionError):
    """A missing or unknown bearer token, where tokens are configured."""


class QueueFull(Exception):
    """The write queue is at capacity; retry later."""


class Busy(Exception):
    """The write queue is full or the store is slow: retry after RETRY_AFTER_SECONDS."""


class WriteFailed(Exception):
    """The rows are neither in the store nor in the spool; nothing was acknowledged."""


class DataRejected(WriteFailed, PermanentError):
    """The store cannot take these rows whatever the retries: answer 400."""


class RowsNotEncodable(DataError, PermanentError):
    """The driver could not encode the rows for the wire (a value its column type cannot
    hold): raised before anything reached the store."""


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
    252,  # TOO_MANY_PARTS (the per-insert partition cap is lifted: pipeline.sink)
    279,  # ALL_CONNECTION_TRIES_FAILED
    319,  # UNKNOWN_STATUS_OF_INSERT
    999,  # KEEPER_EXCEPTION
})


def is_data_error(exc: BaseException) -> bool:
    """True when `exc` says the rows themselves cannot be stored as they are."""
    if isinstance(exc, (PermanentError, DataError)):
        return True
    return isinstance(exc, DatabaseError) and exc.code in DATA_ERROR_CODES


def is_store_error(exc: BaseException) -> bool:
    """True when `exc` names the store's state, never the rows'."""
    return isinstance(exc, DatabaseError) and exc.code in STORE_ERROR_CODES


def describe(exc: BaseException) -> str:
    """One line for logs, quarantine notes and client answers."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:500]}"


# --- the receivers' answers -----------------------------------------------------------

@dataclass(frozen=True)
class Answer:
    """How a receiver answers a request that failed with some exception."""

    rpc_code: int  # google.rpc.Code: the gRPC status, and the code in HTTP's Status body
    http_status: int
    retry_after: int | None  # seconds (Retry-After, gRPC RetryInfo); None: do not retry
    prefix: str = ""  # before the exception's own message
    # servelens_receiver_refused_requests' reason; None where the intake counted it
    reason: str | None = None

    def message(self, exc: BaseException) -> str:
        return f"{self.prefix}{exc}"


_UNAVAILABLE = Answer(code_pb2.UNAVAILABLE, 503, RETRY_AFTER_SECONDS)
_TOO_LARGE = Answer(code_pb2.RESOURCE_EXHAUSTED, 413, None, reason="too_large")
# Anything no row names: our own failure, so the client keeps its data and retries.
INTERNAL = Answer(code_pb2.UNAVAILABLE, 503, RETRY_AFTER_SECONDS, "internal error: ", reason="internal")

# Looked up along the exception's class hierarchy, nearest class first.
ANSWERS: dict[type[BaseException], Answer] = {
    DataRejected: Answer(code_pb2.INVALID_ARGUMENT, 400, None, "rows rejected by the store: "),
    WriteFailed: Answer(code_pb2.UNAVAILABLE, 503, RETRY_AFTER_SECONDS, "store unavailable: "),
    Busy: _UNAVAILABLE,
    QueueFull: _UNAVAILABLE,
    PermanentError: Answer(code_pb2.INVALID_ARGUMENT, 400, None, reason="malformed"),
    Unauthenticated: Answer(code_pb2.UNAUTHENTICATED, 401, None, reason="unauthorized"),
}


def answer(exc: BaseException) -> Answer:
    """The answer to a request that raised `exc`: the table's, or INTERNAL."""
    for cls in type(exc).__mro__:
        found = ANSWERS.get(cls)
        if found is not None:
            if cls is PermanentError and getattr(exc, "status", 400) == 413:
                return _TOO_LARGE
            return found
    return INTERNAL
