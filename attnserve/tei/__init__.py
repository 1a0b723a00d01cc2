"""text-embeddings-inference's gRPC API (package `tei.v1`), generated from protos/attnserve/tei/ by
protos/generate.py.

POOL holds its messages' descriptors: tei-client registers the same `tei.v1.*` names in protobuf's default pool,
which refuses a name defined twice; in a pool of their own, attnserve's server and TEI's client can share a process.
The wire format does not depend on the pool.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
