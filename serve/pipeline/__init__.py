"""Serving a cut manifest as a pipeline of processes (the head is stage 0; SPEC §7, issue 12).

    transport.py  the seam: messages (msgpack header + numpy frames) over ZeroMQ
    liveness.py   heartbeats and deadlines on both sides; who ends whom
    work.py       one stage's item: the pool's plans on its states, then its calls
    stage.py      a stage process: Hello, Table, load, Ready, items until stop
    pipeline.py   the runtime-like object the scheduler drives on the head
    head.py       building the head: start or await the stages, size the pool, hand out Tables
    plan.py       which stage manifests: a cut directory, --at, the config's cut, or balanced
"""
