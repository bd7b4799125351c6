"""Protobuf wire format as a tree a fuzzer can edit: each field a node (number, wire type,
value), the length-delimited ones that hold a message (per the descriptor) parsed into
child nodes. Encoding recomputes every length, so a mutation deep inside a request yields
a request that is well formed everywhere else, or, with `length_delta`, one whose
declared length lies."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VARINT, I64, LEN, I32 = 0, 1, 2, 5


@dataclass
class Node:
    number: int
    wire: int
    value: Any  # int (VARINT), bytes (I64, I32, LEN), or list[Node] (a parsed message)
    descriptor: Any = None  # the FieldDescriptor, when the number is a known field
    length_delta: int = 0  # added to a LEN field's declared length when encoding
    children_of: Any = field(default=None, repr=False)  # the message Descriptor of list values


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64 values take ten bytes, as protobuf writes them
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def parse(buf: bytes, descriptor: Any) -> list[Node]:
    """A valid serialized message -> its nodes (raises on malformed input)."""
    nodes, pos = [], 0
    while pos < len(buf):
        tag, pos = _read_varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        fd = descriptor.fields_by_number.get(number) if descriptor is not None else None
        if wire == VARINT:
            value, pos = _read_varint(buf, pos)
            nodes.append(Node(number, wire, value, fd))
        elif wire in (I64, I32):
            size = 8 if wire == I64 else 4
            nodes.append(Node(number, wire, buf[pos:pos + size], fd))
            pos += size
        elif wire == LEN:
            size, pos = _read_varint(buf, pos)
            payload = buf[pos:pos + size]
            pos += size
            if fd is not None and fd.message_type is not None:
                nodes.append(Node(number, wire, parse(payload, fd.message_type), fd,
                                  children_of=fd.message_type))
            else:
                nodes.append(Node(number, wire, payload, fd))
        else:
            raise ValueError(f"wire type {wire} in a message built by the proto classes")
    return nodes


def encode(nodes: list[Node]) -> bytes:
    out = bytearray()
    for node in nodes:
        out += varint(node.number << 3 | node.wire)
        if node.wire == VARINT:
            out += varint(node.value)
        elif node.wire in (I64, I32):
            out += node.value
        elif node.wire == LEN:
            payload = encode(node.value) if isinstance(node.value, list) else node.value
            out += varint(max(len(payload) + node.length_delta, 0)) + payload
        else:  # groups (3, 4) and the invalid 6, 7: the tag alone, then whatever value bytes
            out += node.value if isinstance(node.value, bytes) else b""
    return bytes(out)


def walk(nodes: list[Node]) -> list[tuple[list[Node], int]]:
    """Every node as (the list holding it, its index), depth first: what a mutation edits."""
    found = []
    for i, node in enumerate(nodes):
        found.append((nodes, i))
        if isinstance(node.value, list):
            found.extend(walk(node.value))
    return found


def messages(nodes: list[Node], full_name: str) -> list[list[Node]]:
    """The child lists of every parsed message of type `full_name`."""
    return [n.value for holder, i in walk(nodes) for n in [holder[i]]
            if isinstance(n.value, list) and n.children_of is not None and n.children_of.full_name == full_name]
