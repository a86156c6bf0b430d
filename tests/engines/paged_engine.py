"""paged-engine: a vLLM-style serving engine for the toy models, written from docs/engine-contract.md
and docs/toy.md (numpy and the standard library; nothing of this project is imported).

Unlike tests/engines/dict_engine.py (a dict of prefixes), it keeps each position's cached entry in a
paged block pool (tests/engines/paged/): full blocks keyed by a block-hash chain (a block's key is
hash(parent key, its tokens)), refcounts, one LRU free queue of unreferenced blocks whose cached
keys are evicted only when the block is reused, and continuous batching (a step loop that admits
waiting requests into the running batch and computes prefill chunks and decode tokens together).
The lined toy (toy-stateful) also keeps a line per sequence and a checkpoint at each request's end.

    python tests/engines/paged_engine.py --port 8000 --model toy-paged [--cache-tokens 8192]
        [--block-size 16] [--chunk 16] [--manifest PATH] [--bug NAME]

`--bug NAME` (or KERN_ENGINE_BUG=NAME) plants one prefix-cache bug from paged/bugs.py; off by default.
"""

import argparse
import os
import signal
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from paged.bugs import BUGS, set_bug  # noqa: E402
from paged.engine import Engine  # noqa: E402
from paged.front import Server  # noqa: E402
from paged.toy import load_family  # noqa: E402


def parse(argv=None):
    ap = argparse.ArgumentParser(prog="paged_engine.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="toy-paged",
                    help="the model name requests carry (its manifest tells the family)")
    ap.add_argument("--manifest", help="the model's manifest (default: manifests/toy/MODEL.json)")
    ap.add_argument("--cache-tokens", type=int, default=8192,
                    help="the block pool's size in tokens (default 8192: small enough that the gate's "
                         "prefix flood evicts)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=16,
                    help="the most prompt tokens of one request in a step (default 16: one block)")
    ap.add_argument("--bug", choices=sorted(BUGS), help="plant one bug (see tests/engines/paged/bugs.py)")
    a = ap.parse_args(argv)
    if a.block_size < 1 or a.cache_tokens < a.block_size or a.chunk < 1:
        ap.error("--block-size and --chunk must be positive and --cache-tokens at least one block")
    return a


def main(argv=None) -> int:
    a = parse(argv)
    set_bug(a.bug)
    try:
        family = load_family(a.model, a.manifest)
    except (OSError, ValueError) as e:
        print(f"paged-engine: {e}", file=sys.stderr)
        return 2
    engine = Engine(family, a.cache_tokens // a.block_size, a.block_size, chunk=a.chunk)
    ready = threading.Event()
    server = Server((a.host, a.port), engine, a.model, ready)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    threading.Thread(target=engine.run, daemon=True, name="engine").start()
    ready.set()
    print(f"paged-engine: {a.model} ({family.name}), {engine.pool.blocks} blocks of {a.block_size}, "
          f"bug {os.environ.get('KERN_ENGINE_BUG') or a.bug or 'none'}, "
          f"port {server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
