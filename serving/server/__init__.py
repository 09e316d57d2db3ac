"""The server: `captioner serve`, TF Serving's gRPC and REST APIs over `serving.versions`.

Flags and options (`flags`, `options`), the process (`model_server`), the
gRPC services, the REST front end (`rest`, `rest_http`, `rest_json`), the
request path shared by both (`predictor`), metrics, TLS and monitoring
config protos, startup checks, thread choice and the infra validator the
Pusher runs. The top of `serving`: it may import every other subpackage but
the client.
"""
