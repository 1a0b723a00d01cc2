"""KServe's Open Inference Protocol over gRPC (package `inference`), generated from protos/attnserve/kserve/ by
protos/generate.py.

POOL holds its messages' descriptors. Triton's client registers the same `inference.*` names in protobuf's default
pool, which refuses a name defined twice; in a pool of their own, attnserve's server and tritonclient.grpc can share a
process. The wire format does not depend on the pool.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
