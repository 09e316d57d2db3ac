"""The client: `captioner caption` and `CaptionClient`, over TF Serving's gRPC API.

Works unchanged against this project's server and `tensorflow_model_server`.
Imports the shared `serving.tensors` and `serving.cli_help` and nothing of the
server, so a client machine needs no server code paths.
"""
