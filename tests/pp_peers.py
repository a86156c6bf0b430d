"""The pipeline's watchers alone, as processes a test can kill, freeze or orphan.

    python tests/pp_peers.py head TIMEOUT          a HeadWatch for stage 1; prints its address
    python tests/pp_peers.py stage ADDR TIMEOUT    a StageWatch for stage 1 of the head at ADDR
Each runs until its watcher ends the process.
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zmq  # noqa: E402

from serve.pipeline.liveness import HeadWatch, StageWatch  # noqa: E402
from serve.pipeline.transport import ZmqWire  # noqa: E402

ctx = zmq.Context()
if sys.argv[1] == "head":
    ctl = ZmqWire.make(ctx, zmq.ROUTER, bind="tcp://127.0.0.1:*")
    watch = HeadWatch(ctl, [1], float(sys.argv[2]))
    watch.start()
    print(ctl.address, flush=True)
    while True:
        msg = watch.inbox.get()
        print("got", msg.kind, flush=True)
else:
    watch = StageWatch(ctx, sys.argv[2], 1, float(sys.argv[3]))
    watch.start()
    print("stage up", flush=True)
    while True:
        time.sleep(1)
