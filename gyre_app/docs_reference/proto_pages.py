"""The events and RPC reference pages, from `proto/` with the comments written there (shell).

protoc (grpcio-tools, the dev extra's pinned code generator) compiles every proto file into a
descriptor set that keeps the source's comments; this module walks it. Events are the messages
of each package's `events.proto` (plus the envelope in `gyre.common.v1`); RPCs are the services
of the other files, followed by the messages and enums those files define.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

from google.protobuf import descriptor_pb2

from gyre.codegen import PROTO_ROOT, proto_files

Fdp = descriptor_pb2.FieldDescriptorProto

# Paths into a FileDescriptorProto, as SourceCodeInfo numbers them (descriptor.proto's field numbers).
MESSAGE_IN_FILE, ENUM_IN_FILE, SERVICE_IN_FILE = 4, 5, 6
FIELD_IN_MESSAGE, NESTED_IN_MESSAGE, ENUM_IN_MESSAGE = 2, 3, 4
VALUE_IN_ENUM, METHOD_IN_SERVICE = 2, 2

SCALARS = {
    value: name.removeprefix("TYPE_").lower()
    for name, value in Fdp.Type.items()
    if name not in ("TYPE_MESSAGE", "TYPE_ENUM", "TYPE_GROUP")
}


def descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    from grpc_tools import protoc  # dev-only dependency, imported late as gyre.codegen does

    includes = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "set.pb"
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{includes}",
            f"--descriptor_set_out={out}",
            "--include_source_info",
            *(str(p.relative_to(PROTO_ROOT)) for p in proto_files()),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed on proto/")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def comments(file: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    """Path -> the comment written before (else after) that element, on one line."""
    out = {}
    for loc in file.source_code_info.location:
        text = loc.leading_comments or loc.trailing_comments
        if text:
            out[tuple(loc.path)] = " ".join(text.split())
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def field_type(field: Fdp, message: descriptor_pb2.DescriptorProto) -> str:
    if field.type in (Fdp.TYPE_MESSAGE, Fdp.TYPE_ENUM):
        name = field.type_name.lstrip(".")
        entry = next(
            (n for n in message.nested_type if n.options.map_entry and name.endswith("." + n.name)), None
        )
        if entry is not None:
            key, value = entry.field
            return f"map<{field_type(key, entry)}, {field_type(value, entry)}>"
    else:
        name = SCALARS[field.type]
    return f"repeated {name}" if field.label == Fdp.LABEL_REPEATED else name


def heading(title: str, note: str | None) -> Iterator[str]:
    yield title
    yield ""
    if note:
        yield note
        yield ""


def message_lines(
    message: descriptor_pb2.DescriptorProto,
    full_name: str,
    path: tuple[int, ...],
    notes: dict[tuple[int, ...], str],
) -> Iterator[str]:
    if message.options.map_entry:
        return
    yield from heading(f"### `{full_name}`", notes.get(path))
    if message.field:
        yield "| field | type | meaning |"
        yield "|---|---|---|"
        for i, field in enumerate(message.field):
            oneof = ""
            if field.HasField("oneof_index") and not field.proto3_optional:
                oneof = f" (one of `{message.oneof_decl[field.oneof_index].name}`)"
            meaning = notes.get((*path, FIELD_IN_MESSAGE, i), "") + oneof
            yield f"| `{field.name}` = {field.number} | `{field_type(field, message)}` | {_cell(meaning)} |"
        yield ""
    for i, enum in enumerate(message.enum_type):
        yield from enum_lines(enum, f"{full_name}.{enum.name}", (*path, ENUM_IN_MESSAGE, i), notes)
    for i, nested in enumerate(message.nested_type):
        yield from message_lines(nested, f"{full_name}.{nested.name}", (*path, NESTED_IN_MESSAGE, i), notes)


def enum_lines(
    enum: descriptor_pb2.EnumDescriptorProto,
    full_name: str,
    path: tuple[int, ...],
    notes: dict[tuple[int, ...], str],
) -> Iterator[str]:
    yield from heading(f"### `{full_name}` (enum)", notes.get(path))
    yield "| value | number | meaning |"
    yield "|---|---|---|"
    for i, value in enumerate(enum.value):
        yield f"| `{value.name}` | {value.number} | {_cell(notes.get((*path, VALUE_IN_ENUM, i), ''))} |"
    yield ""


def definitions(file: descriptor_pb2.FileDescriptorProto) -> Iterator[str]:
    notes = comments(file)
    for i, enum in enumerate(file.enum_type):
        yield from enum_lines(enum, f"{file.package}.{enum.name}", (ENUM_IN_FILE, i), notes)
    for i, message in enumerate(file.message_type):
        yield from message_lines(message, f"{file.package}.{message.name}", (MESSAGE_IN_FILE, i), notes)


def services(file: descriptor_pb2.FileDescriptorProto) -> Iterator[str]:
    notes = comments(file)
    for i, service in enumerate(file.service):
        yield from heading(f"### `{file.package}.{service.name}`", notes.get((SERVICE_IN_FILE, i)))
        yield "| RPC | request | response | what it does |"
        yield "|---|---|---|---|"
        for j, method in enumerate(service.method):
            request = ("stream " if method.client_streaming else "") + method.input_type.lstrip(".")
            response = ("stream " if method.server_streaming else "") + method.output_type.lstrip(".")
            note = notes.get((SERVICE_IN_FILE, i, METHOD_IN_SERVICE, j), "")
            yield f"| `{method.name}` | `{request}` | `{response}` | {_cell(note)} |"
        yield ""


def _ours(fds: descriptor_pb2.FileDescriptorSet) -> list[descriptor_pb2.FileDescriptorProto]:
    return sorted((f for f in fds.file if f.name.startswith("gyre/")), key=lambda f: f.name)


HEADER = (
    "*Generated by `python -m gyre_app.docs_reference` from `proto/`; do not edit. "
    "The rules every contract follows: [Contracts](../contracts.md).*"
)


def render_events(fds: descriptor_pb2.FileDescriptorSet) -> str:
    lines = [
        "# Events reference",
        "",
        HEADER,
        "",
        "Every event travels in the envelope below, on the subject `<prefix>.<service>.v1.<EventName>`",
        "of its producer's stream. Who consumes each event is in [Contracts](../contracts.md#events).",
        "",
    ]
    for file in _ours(fds):
        if file.package == "gyre.common.v1" or file.name.endswith("/events.proto"):
            lines += [f"## `{file.package}` (`proto/{file.name}`)", "", *definitions(file)]
    return "\n".join(lines)


def render_rpcs(fds: descriptor_pb2.FileDescriptorSet) -> str:
    lines = [
        "# RPC reference",
        "",
        HEADER,
        "",
        "Every service also serves `grpc.health.v1.Health` and reflection. A mutating RPC takes a",
        "client-chosen `request_id`: a repeat returns the first answer.",
        "",
    ]
    for file in _ours(fds):
        if file.package != "gyre.common.v1" and not file.name.endswith("/events.proto"):
            lines += [f"## `{file.package}` (`proto/{file.name}`)", "", *services(file), *definitions(file)]
    return "\n".join(lines)
