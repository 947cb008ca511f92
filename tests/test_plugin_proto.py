"""The kubelet's wire contracts as our .proto files state them, and the generated modules
committed beside them: a drifted module or a renumbered field fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from tessera.agent.plugin.proto import (
    codegen,
    dra_health_v1alpha1_pb2,
    dra_v1_pb2,
    dra_v1beta1_pb2,
    pluginregistration_v1_pb2,
)


def test_committed_generated_modules_match_the_proto_files(tmp_path: Path) -> None:
    generated = codegen.generate(tmp_path)
    assert len(generated) == 3 * len(codegen.proto_files())
    for path in generated:
        committed = codegen.PROTO_DIR / path.name
        assert committed.exists(), f"{path.name} is not committed: run python -m tessera.agent.plugin.proto.codegen"
        assert committed.read_bytes() == path.read_bytes(), (
            f"{path.name} drifted from its .proto: run python -m tessera.agent.plugin.proto.codegen"
        )


# (message, field) -> (number, repeated, type), as k8s.io/kubelet/pkg/apis/... defines them.
DRA_FIELDS = {
    ("Claim", "namespace"): (1, False, FieldDescriptor.TYPE_STRING),
    ("Claim", "uid"): (2, False, FieldDescriptor.TYPE_STRING),
    ("Claim", "name"): (3, False, FieldDescriptor.TYPE_STRING),
    ("NodePrepareResourcesRequest", "claims"): (1, True, FieldDescriptor.TYPE_MESSAGE),
    ("NodePrepareResourcesResponse", "claims"): (1, True, FieldDescriptor.TYPE_MESSAGE),
    ("NodePrepareResourceResponse", "devices"): (1, True, FieldDescriptor.TYPE_MESSAGE),
    ("NodePrepareResourceResponse", "error"): (2, False, FieldDescriptor.TYPE_STRING),
    ("Device", "request_names"): (1, True, FieldDescriptor.TYPE_STRING),
    ("Device", "pool_name"): (2, False, FieldDescriptor.TYPE_STRING),
    ("Device", "device_name"): (3, False, FieldDescriptor.TYPE_STRING),
    ("Device", "cdi_device_ids"): (4, True, FieldDescriptor.TYPE_STRING),
    ("NodeUnprepareResourcesRequest", "claims"): (1, True, FieldDescriptor.TYPE_MESSAGE),
    ("NodeUnprepareResourcesResponse", "claims"): (1, True, FieldDescriptor.TYPE_MESSAGE),
    ("NodeUnprepareResourceResponse", "error"): (1, False, FieldDescriptor.TYPE_STRING),
}
REGISTRATION_FIELDS = {
    ("PluginInfo", "type"): (1, False, FieldDescriptor.TYPE_STRING),
    ("PluginInfo", "name"): (2, False, FieldDescriptor.TYPE_STRING),
    ("PluginInfo", "endpoint"): (3, False, FieldDescriptor.TYPE_STRING),
    ("PluginInfo", "supported_versions"): (4, True, FieldDescriptor.TYPE_STRING),
    ("RegistrationStatus", "plugin_registered"): (1, False, FieldDescriptor.TYPE_BOOL),
    ("RegistrationStatus", "error"): (2, False, FieldDescriptor.TYPE_STRING),
}

HEALTH_FIELDS = {
    ("DeviceIdentifier", "pool_name"): (1, False, FieldDescriptor.TYPE_STRING),
    ("DeviceIdentifier", "device_name"): (2, False, FieldDescriptor.TYPE_STRING),
    ("DeviceHealth", "device"): (1, False, FieldDescriptor.TYPE_MESSAGE),
    ("DeviceHealth", "health"): (2, False, FieldDescriptor.TYPE_ENUM),
    ("DeviceHealth", "last_updated_time"): (3, False, FieldDescriptor.TYPE_INT64),
    ("DeviceHealth", "health_check_timeout_seconds"): (4, False, FieldDescriptor.TYPE_INT64),
    ("DeviceHealth", "message"): (5, False, FieldDescriptor.TYPE_STRING),
    ("NodeWatchResourcesResponse", "devices"): (1, True, FieldDescriptor.TYPE_MESSAGE),
}


def _fields(module: object) -> dict[tuple[str, str], tuple[int, bool, int]]:
    descriptor = module.DESCRIPTOR  # type: ignore[attr-defined]
    return {
        (message.name, f.name): (f.number, f.is_repeated, f.type)
        for message in descriptor.message_types_by_name.values()
        for f in message.fields
    }


@pytest.mark.parametrize("module", [dra_v1_pb2, dra_v1beta1_pb2], ids=["v1", "v1beta1"])
def test_dra_messages_have_the_kubelets_field_numbers(module: object) -> None:
    fields = _fields(module)
    for key, expected in DRA_FIELDS.items():
        assert fields[key] == expected, key


def test_only_v1_devices_carry_a_share_id_as_optional_field_5() -> None:
    share = dra_v1_pb2.Device.DESCRIPTOR.fields_by_name["share_id"]
    assert (share.number, share.type, share.has_presence) == (5, FieldDescriptor.TYPE_STRING, True)
    assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name
    # On the wire: field 5, length-delimited (tag 0x2a).
    assert dra_v1_pb2.Device(share_id="ab").SerializeToString() == b"\x2a\x02ab"


def test_registration_messages_have_the_kubelets_field_numbers() -> None:
    fields = _fields(pluginregistration_v1_pb2)
    for key, expected in REGISTRATION_FIELDS.items():
        assert fields[key] == expected, key


def test_health_messages_have_the_kubelets_field_numbers_and_enum_values() -> None:
    fields = _fields(dra_health_v1alpha1_pb2)
    for key, expected in HEALTH_FIELDS.items():
        assert fields[key] == expected, key
    assert not dra_health_v1alpha1_pb2.NodeWatchResourcesRequest.DESCRIPTOR.fields
    status = dra_health_v1alpha1_pb2.DESCRIPTOR.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in status.values} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
    method = dra_health_v1alpha1_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"].methods_by_name[
        "NodeWatchResources"
    ]
    assert (method.server_streaming, method.client_streaming) == (True, False)


@pytest.mark.parametrize(
    ("module", "service", "methods"),
    [
        (dra_v1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin", {"NodePrepareResources", "NodeUnprepareResources"}),
        (dra_v1beta1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
         {"NodePrepareResources", "NodeUnprepareResources"}),
        (pluginregistration_v1_pb2, "pluginregistration.Registration", {"GetInfo", "NotifyRegistrationStatus"}),
        (dra_health_v1alpha1_pb2, "v1alpha1.DRAResourceHealth", {"NodeWatchResources"}),
    ],
    ids=["dra-v1", "dra-v1beta1", "registration", "health-v1alpha1"],
)
def test_services_have_the_kubelets_full_names(module: object, service: str, methods: set[str]) -> None:
    services = module.DESCRIPTOR.services_by_name  # type: ignore[attr-defined]
    (found,) = services.values()
    assert found.full_name == service
    assert set(found.methods_by_name) == methods
