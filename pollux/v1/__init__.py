"""Generated protobuf and gRPC code of the pollux.v1 API (do not edit)."""
