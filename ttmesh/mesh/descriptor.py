"""tt-metal's mesh graph descriptor (MGD 2.0): a model, written as protobuf text and parsed back.

tt-metal's fabric reads ``TT_MESH_GRAPH_DESC_PATH``: protobuf text format of its
``tt.tt_fabric.proto.MeshGraphDescriptor``. The schema below is declared here, in the protobuf
package's own text format for a ``FileDescriptorProto``, with the fields of ttnn 0.81.1's
schema (read from its ``libtt_metal.so``) that ttmesh writes or must read in stock descriptors.
Writing and parsing go through ``google.protobuf.text_format``: no hand-written parser.

Terms: a *mesh* is a grid of chips (``device_topology`` dims [rows, cols], each dimension LINE
or RING) split over processes by ``host_topology``; ``channels`` is how many Ethernet links
neighbours must have (STRICT: at least ``count``, as ttnn 0.81.1 checks it; RELAXED: one).
Several meshes are joined by a graph descriptor of type FABRIC.
"""

from __future__ import annotations

import json
import os
import zlib
from functools import cache
from pathlib import Path
from typing import Any

from ttmesh.dataclass import dataclass, field

SCHEMA_TEXT = r"""
name: "ttmesh_mesh_graph_descriptor.proto"
package: "tt.tt_fabric.proto"
syntax: "proto3"
message_type {
  name: "MeshGraphDescriptor"
  field { name: "mesh_descriptors" number: 1 label: LABEL_REPEATED type: TYPE_MESSAGE
          type_name: ".tt.tt_fabric.proto.MeshDescriptor" }
  field { name: "graph_descriptors" number: 2 label: LABEL_REPEATED type: TYPE_MESSAGE
          type_name: ".tt.tt_fabric.proto.GraphDescriptor" }
  field { name: "top_level_instance" number: 3 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".tt.tt_fabric.proto.NodeRef" }
  field { name: "pinnings" number: 5 label: LABEL_REPEATED type: TYPE_MESSAGE
          type_name: ".tt.tt_fabric.proto.AsicPinning" }
}
message_type {
  name: "MeshDescriptor"
  field { name: "name" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "arch" number: 2 label: LABEL_OPTIONAL type: TYPE_ENUM
          type_name: ".tt.tt_fabric.proto.Architecture" }
  field { name: "device_topology" number: 3 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".tt.tt_fabric.proto.TorusTopology" }
  field { name: "channels" number: 4 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".tt.tt_fabric.proto.Channels" }
  field { name: "host_topology" number: 5 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".tt.tt_fabric.proto.MeshTopology" }
}
message_type {
  name: "GraphDescriptor"
  field { name: "name" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "type" number: 2 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "instances" number: 3 label: LABEL_REPEATED type: TYPE_MESSAGE
          type_name: ".tt.tt_fabric.proto.NodeRef" }
  field { name: "graph_topology" number: 4 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".tt.tt_fabric.proto.GraphTopology" oneof_index: 0 proto3_optional: true }
  field { name: "connections" number: 5 label: LABEL_REPEATED type: TYPE_MESSAGE
          type_name: ".tt.tt_fabric.proto.Connection" }
  oneof_decl { name: "_graph_topology" }
}
message_type {
  name: "GraphTopology"
  field { name: "layout_type" number: 1 label: LABEL_OPTIONAL type: TYPE_ENUM
          type_name: ".tt.tt_fabric.proto.GraphTopology.Type" }
  field { name: "channels" number: 2 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".tt.tt_fabric.proto.Channels" }
  field { name: "assign_z_direction" number: 3 label: LABEL_OPTIONAL type: TYPE_BOOL
          oneof_index: 0 proto3_optional: true }
  oneof_decl { name: "_assign_z_direction" }
  enum_type { name: "Type" value { name: "INVALID_TYPE" number: 0 }
              value { name: "ALL_TO_ALL" number: 1 } value { name: "RING" number: 2 } }
}
message_type {
  name: "NodeRef"
  field { name: "mesh" number: 1 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".tt.tt_fabric.proto.MeshRef" oneof_index: 0 }
  field { name: "graph" number: 2 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".tt.tt_fabric.proto.GraphRef" oneof_index: 0 }
  oneof_decl { name: "node_ref" }
}
message_type {
  name: "GraphRef"
  field { name: "graph_descriptor" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "graph_id" number: 2 label: LABEL_OPTIONAL type: TYPE_INT32 }
}
message_type {
  name: "MeshRef"
  field { name: "mesh_descriptor" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "mesh_id" number: 2 label: LABEL_OPTIONAL type: TYPE_INT32 }
  field { name: "device_id" number: 3 label: LABEL_OPTIONAL type: TYPE_INT32
          oneof_index: 0 proto3_optional: true }
  oneof_decl { name: "_device_id" }
}
message_type {
  name: "MeshTopology"
  field { name: "dims" number: 1 label: LABEL_REPEATED type: TYPE_INT32 }
}
message_type {
  name: "TorusTopology"
  field { name: "dims" number: 3 label: LABEL_REPEATED type: TYPE_INT32 }
  field { name: "dim_types" number: 4 label: LABEL_REPEATED type: TYPE_ENUM
          type_name: ".tt.tt_fabric.proto.TorusTopology.Type" }
  enum_type { name: "Type" value { name: "INVALID_TYPE" number: 0 }
              value { name: "LINE" number: 1 } value { name: "RING" number: 2 } }
}
message_type {
  name: "Channels"
  field { name: "count" number: 1 label: LABEL_OPTIONAL type: TYPE_INT32 }
  field { name: "policy" number: 2 label: LABEL_OPTIONAL type: TYPE_ENUM
          type_name: ".tt.tt_fabric.proto.Policy" oneof_index: 0 proto3_optional: true }
  oneof_decl { name: "_policy" }
}
message_type {
  name: "Connection"
  field { name: "nodes" number: 1 label: LABEL_REPEATED type: TYPE_MESSAGE
          type_name: ".tt.tt_fabric.proto.NodeRef" }
  field { name: "channels" number: 2 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".tt.tt_fabric.proto.Channels" }
  field { name: "directional" number: 3 label: LABEL_OPTIONAL type: TYPE_BOOL
          oneof_index: 0 proto3_optional: true }
  field { name: "routing_direction" number: 4 label: LABEL_REPEATED type: TYPE_ENUM
          type_name: ".tt.tt_fabric.proto.RoutingDirection" }
  field { name: "assign_z_direction" number: 5 label: LABEL_OPTIONAL type: TYPE_BOOL
          oneof_index: 1 proto3_optional: true }
  oneof_decl { name: "_directional" }
  oneof_decl { name: "_assign_z_direction" }
}
message_type {
  name: "AsicPinning"
  field { name: "logical_fabric_node_id" number: 1 label: LABEL_REPEATED type: TYPE_MESSAGE
          type_name: ".tt.tt_fabric.proto.LogicalFabricNodeId" }
  field { name: "physical_asic_position" number: 2 label: LABEL_REPEATED type: TYPE_MESSAGE
          type_name: ".tt.tt_fabric.proto.PhysicalAsicPosition" }
}
message_type {
  name: "LogicalFabricNodeId"
  field { name: "mesh_id" number: 1 label: LABEL_OPTIONAL type: TYPE_UINT32
          oneof_index: 0 proto3_optional: true }
  field { name: "chip_id" number: 2 label: LABEL_OPTIONAL type: TYPE_UINT32
          oneof_index: 1 proto3_optional: true }
  oneof_decl { name: "_mesh_id" }
  oneof_decl { name: "_chip_id" }
}
message_type {
  name: "PhysicalAsicPosition"
  field { name: "tray_id" number: 1 label: LABEL_OPTIONAL type: TYPE_UINT32
          oneof_index: 0 proto3_optional: true }
  field { name: "asic_location" number: 2 label: LABEL_OPTIONAL type: TYPE_UINT32
          oneof_index: 1 proto3_optional: true }
  oneof_decl { name: "_tray_id" }
  oneof_decl { name: "_asic_location" }
}
enum_type { name: "Architecture" value { name: "INVALID_ARCHITECTURE" number: 0 }
            value { name: "WORMHOLE_B0" number: 1 } value { name: "BLACKHOLE" number: 2 } }
enum_type { name: "RoutingDirection" value { name: "INVALID" number: 0 }
            value { name: "N" number: 1 } value { name: "E" number: 2 }
            value { name: "S" number: 3 } value { name: "W" number: 4 }
            value { name: "C" number: 5 } value { name: "NONE" number: 6 } }
enum_type { name: "Policy" value { name: "INVALID_POLICY" number: 0 }
            value { name: "STRICT" number: 1 } value { name: "RELAXED" number: 2 } }
"""


class DescriptorError(ValueError):
    """Not a mesh graph descriptor ttmesh understands; the message says where."""


@cache
def _message_class() -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

    proto = text_format.Parse(SCHEMA_TEXT, descriptor_pb2.FileDescriptorProto())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    desc = pool.FindMessageTypeByName("tt.tt_fabric.proto.MeshGraphDescriptor")
    return message_factory.GetMessageClass(desc)


@dataclass(frozen=True)
class MeshSpec:
    """One mesh of a mesh graph descriptor: its grid, dimension types and channels."""

    name: str
    arch: str  # BLACKHOLE | WORMHOLE_B0
    dims: tuple[int, int]
    dim_types: tuple[str, str] = ("LINE", "LINE")
    host_dims: tuple[int, int] = (1, 1)
    channels: int = 1
    policy: str = "RELAXED"


@dataclass(frozen=True)
class Connection:
    """Links between two meshes of a FABRIC graph (by mesh id)."""

    mesh_a: int
    mesh_b: int
    channels: int
    policy: str = "RELAXED"


@dataclass
class MeshGraph:
    """A whole descriptor: its meshes, their instances and the connections between them."""

    meshes: list[MeshSpec]
    # (mesh descriptor name, mesh_id) per instance; one instance means no graph descriptor
    instances: list[tuple[str, int]]
    connections: list[Connection] = field(default_factory=list)
    graph_name: str = "G0"

    @property
    def is_graph(self) -> bool:
        return len(self.instances) > 1

    def mesh(self, name: str) -> MeshSpec:
        return next(m for m in self.meshes if m.name == name)


def single_mesh(spec: MeshSpec) -> MeshGraph:
    return MeshGraph([spec], [(spec.name, 0)])


def _cache_dir() -> Path:
    from ttmesh.paths import xdg_dir

    return Path(xdg_dir("XDG_CACHE_HOME", ".cache") or ".") / "ttmesh" / "mgd"


def to_text(graph: MeshGraph, comment: str = "") -> str:
    """The protobuf text tt-metal reads, preceded by ``# `` comment lines.

    Rendering imports protobuf (tens of milliseconds); the text of a given graph never changes,
    so it is remembered on disk (one file per graph, whatever the comment: the ranks of an
    isolated job share one) and later launches skip the import.
    """
    head = "".join(f"# {line}\n" for line in comment.splitlines())
    return head + _body(graph)


_bodies: dict[str, str] = {}


def _body(graph: MeshGraph) -> str:
    graph_key = repr(graph)
    if graph_key in _bodies:
        return _bodies[graph_key]
    key = {"schema": zlib.crc32(SCHEMA_TEXT.encode()), "graph": graph_key}
    # The file's name is a checksum; the key inside it is compared whole.
    name = f"{zlib.crc32(json.dumps(key).encode()):08x}.json"
    cached = _cache_dir() / name
    try:
        from ttmesh import fileread

        data = json.loads(fileread.read_bytes(cached, fileread.MiB, "cached descriptor"))
        if data["key"] == key and isinstance(data["text"], str):
            _bodies[graph_key] = data["text"]
            return str(data["text"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    text = _render(graph, "")
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{name}.{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, "text": text}))
        os.replace(tmp, cached)
    except OSError:
        pass
    _bodies[graph_key] = text
    return text


def _number(msg: Any, field: str, name: str) -> int:
    """The number of enum value ``name`` of ``msg.field``."""
    return msg.DESCRIPTOR.fields_by_name[field].enum_type.values_by_name[name].number


def _name(msg: Any, field: str, number: int) -> str:
    return msg.DESCRIPTOR.fields_by_name[field].enum_type.values_by_number[number].name


def _set_channels(channels: Any, count: int, policy: str) -> None:
    channels.count = count
    channels.policy = _number(channels, "policy", policy)


def _policy(channels: Any) -> str:
    """A Channels message's policy; tt-metal's default when absent is RELAXED."""
    return _name(channels, "policy", channels.policy) if channels.HasField("policy") else "RELAXED"


def _render(graph: MeshGraph, comment: str) -> str:
    from google.protobuf import text_format

    msg = _message_class()()
    for m in graph.meshes:
        md = msg.mesh_descriptors.add()
        md.name = m.name
        md.arch = _number(md, "arch", m.arch)
        md.device_topology.dims.extend(m.dims)
        if any(t != "LINE" for t in m.dim_types):
            topo = md.device_topology
            topo.dim_types.extend(_number(topo, "dim_types", t) for t in m.dim_types)
        md.host_topology.dims.extend(m.host_dims)
        _set_channels(md.channels, m.channels, m.policy)
    if graph.is_graph:
        gd = msg.graph_descriptors.add()
        gd.name = graph.graph_name
        gd.type = "FABRIC"
        for name, mesh_id in graph.instances:
            ref = gd.instances.add().mesh
            ref.mesh_descriptor = name
            ref.mesh_id = mesh_id
        names = dict((mid, name) for name, mid in graph.instances)
        for c in graph.connections:
            conn = gd.connections.add()
            for mid in (c.mesh_a, c.mesh_b):
                ref = conn.nodes.add().mesh
                ref.mesh_descriptor = names[mid]
                ref.mesh_id = mid
            _set_channels(conn.channels, c.channels, c.policy)
        top = msg.top_level_instance.graph
        top.graph_descriptor = graph.graph_name
        top.graph_id = 0
    else:
        name, mesh_id = graph.instances[0]
        top = msg.top_level_instance.mesh
        top.mesh_descriptor = name
        top.mesh_id = mesh_id
    head = "".join(f"# {line}\n" for line in comment.splitlines())
    return head + text_format.MessageToString(msg)


def parse(text: str) -> MeshGraph:
    """Read a descriptor (ours or tt-metal's stock ones) back into the model."""
    from google.protobuf import text_format

    msg = _message_class()()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as exc:
        raise DescriptorError(str(exc)) from exc
    meshes = []
    for md in msg.mesh_descriptors:
        topo = md.device_topology
        types = [_name(topo, "dim_types", t) for t in topo.dim_types]
        dims = tuple(topo.dims)
        if len(dims) != 2:
            raise DescriptorError(
                f"mesh {md.name}: ttmesh handles 2-D meshes, got dims {list(dims)}"
            )
        types += ["LINE"] * (2 - len(types))
        meshes.append(
            MeshSpec(
                name=md.name,
                arch=_name(md, "arch", md.arch),
                dims=(dims[0], dims[1]),
                dim_types=(types[0], types[1]),
                host_dims=tuple(md.host_topology.dims) or (1, 1),
                channels=md.channels.count,
                policy=_policy(md.channels),
            )
        )
    top = msg.top_level_instance
    if top.WhichOneof("node_ref") == "mesh":
        return MeshGraph(meshes, [(top.mesh.mesh_descriptor, top.mesh.mesh_id)])
    graph = next((g for g in msg.graph_descriptors if g.name == top.graph.graph_descriptor), None)
    if graph is None:
        raise DescriptorError(f"top-level graph {top.graph.graph_descriptor!r} is not defined")
    instances = [(i.mesh.mesh_descriptor, i.mesh.mesh_id) for i in graph.instances]
    connections = []
    for c in graph.connections:
        ids = [n.mesh.mesh_id for n in c.nodes]
        if len(ids) != 2 or any(n.WhichOneof("node_ref") != "mesh" for n in c.nodes):
            raise DescriptorError(f"graph {graph.name}: only mesh-to-mesh connections are modelled")
        connections.append(Connection(ids[0], ids[1], c.channels.count, _policy(c.channels)))
    return MeshGraph(meshes, instances, connections, graph.name)
