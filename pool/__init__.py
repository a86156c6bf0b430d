"""State accounting for a paged-KV server, with no device: chunks and remaps, pages and leases,
frozen checkpoints, the host tier and the token-keyed prefix index. Decisions come back as data
(`Remap`, `Copies`) for the runtime to execute; refusals come back as `Denied` values.
"""

from pool.chunks import Arena, Remap
from pool.denied import Denied, PoolError
from pool.geometry import Geometry, GeometryError, chunk_size, chunks_for
from pool.host import Host, Parked, runs
from pool.lease import Checkpoint, Lease
from pool.pages import Pool
from pool.prefix import Evicted, Hit, Prefix, Tier
from pool.store import Copies, Node, Slot, Store
from pool.tokens import Tokens

__all__ = [
    "Arena",
    "Checkpoint",
    "Copies",
    "Denied",
    "Evicted",
    "Geometry",
    "GeometryError",
    "Hit",
    "Host",
    "Lease",
    "Node",
    "Parked",
    "Pool",
    "PoolError",
    "Prefix",
    "Remap",
    "Slot",
    "Store",
    "Tier",
    "Tokens",
    "chunk_size",
    "chunks_for",
    "runs",
]
