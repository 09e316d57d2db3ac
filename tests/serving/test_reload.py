"""ModelService.HandleReloadConfigRequest with TF Serving's rules."""
from __future__ import annotations

import grpc
import pytest
from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc
from tensorflow_serving.config import model_server_config_pb2

from serving.client.caption_client import CaptionClient
from tests.serving.conftest import RED
from tests.serving.fixtures import expected_caption, solid_image


def model_config(models) -> model_server_config_pb2.ModelServerConfig:
    """models: [(name, base_path, versions or None for latest, {label: version})]."""
    config = model_server_config_pb2.ModelServerConfig()
    for name, base, versions, labels in models:
        entry = config.model_config_list.config.add(name=name, base_path=base,
                                                    model_platform="tensorflow")
        if versions:
            entry.model_version_policy.specific.versions.extend(versions)
        for label, version in labels.items():
            entry.version_labels[label] = version
    return config


class Reloader:
    def __init__(self, server):
        self.stub = model_service_pb2_grpc.ModelServiceStub(
            grpc.insecure_channel(server.grpc_address))

    def __call__(self, config) -> model_management_pb2.ReloadConfigResponse:
        return self.stub.HandleReloadConfigRequest(
            model_management_pb2.ReloadConfigRequest(config=config), timeout=120)


def caption(server, model, version=None):
    with CaptionClient(server.grpc_address, model_name=model, version=version) as client:
        return client.caption([solid_image(RED)])[0]


def test_reload_adds_removes_and_relabels_models(make_base, start_server):
    base = make_base({1: "image", 2: "square"})
    other = make_base({1: "square"}, name="other")
    server = start_server(base)
    reload = Reloader(server)
    assert caption(server, "captioner")["caption"] == expected_caption(RED, "square")

    # Serve both versions and add a second model: they are loaded on return.
    response = reload(model_config([("captioner", base, [1, 2], {}),
                                    ("other", other, None, {})]))
    assert response.status.error_code == 0
    assert server.manager.available_versions("captioner") == [1, 2]
    assert server.manager.available_versions("other") == [1]
    # Then label them (TF Serving: a label needs its version loaded first).
    reload(model_config([("captioner", base, [1, 2], {"stable": 1, "canary": 2}),
                         ("other", other, None, {})]))
    assert caption(server, "captioner", "stable")["caption"] == expected_caption(RED, "image")
    assert caption(server, "captioner", "canary")["version"] == 2
    assert caption(server, "other")["caption"] == expected_caption(RED, "square")

    # Move a label between loaded versions; drop the other model.
    reload(model_config([("captioner", base, [1, 2], {"stable": 2})]))
    assert caption(server, "captioner", "stable")["version"] == 2
    assert server.manager.model_names == ["captioner"]
    with pytest.raises(Exception, match="NOT_FOUND"):
        caption(server, "other")


def test_a_label_on_an_unavailable_version_is_refused(make_base, start_server):
    base = make_base({1: "image", 2: "square"})
    server = start_server(base)  # latest:1 serves version 2 only
    reload = Reloader(server)
    with pytest.raises(grpc.RpcError) as e:
        reload(model_config([("captioner", base, [1, 2], {"stable": 1})]))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.value.details() == ("Request to assign label to version 1 of model captioner, "
                                 "which is not currently available for inference")
    # Nothing changed: still only version 2.
    assert server.manager.available_versions("captioner") == [2]
    # A custom config is not a model_config_list.
    config = model_server_config_pb2.ModelServerConfig()
    config.custom_model_config.type_url = "x"
    with pytest.raises(grpc.RpcError) as e:
        reload(config)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_allow_version_labels_for_unavailable_models_only_for_new_labels(make_base,
                                                                        start_server):
    base = make_base({1: "image", 2: "square"})
    server = start_server(base, allow_version_labels_for_unavailable_models=True)
    reload = Reloader(server)
    # A new label may name a version that is not loaded (yet).
    reload(model_config([("captioner", base, [2], {"next": 3, "stable": 2})]))
    # An existing label may not move to an unavailable version...
    with pytest.raises(grpc.RpcError) as e:
        reload(model_config([("captioner", base, [2], {"next": 3, "stable": 1})]))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # ...but may stay where it is, and may move to a loaded one.
    reload(model_config([("captioner", base, [1, 2], {"next": 3, "stable": 2})]))
    reload(model_config([("captioner", base, [1, 2], {"next": 3, "stable": 1})]))
    assert caption(server, "captioner", "stable")["version"] == 1
