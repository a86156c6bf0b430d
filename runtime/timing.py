"""Where a runtime step's time goes (`StepTiming`), summed over steps: `Runtime.timing`, read by the
scheduler's stats (`as_dict`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

__all__ = ["StepTiming"]


@dataclass
class StepTiming:
    """Where a step's time goes, summed over steps (seconds): host staging of the fills, their
    upload, issuing the launches (or a graph replay), the kernels themselves (device time between
    two marks on the runtime's stream: CUDA events on a GPU), and the readback of the tokens."""

    steps: int = 0
    decode_steps: int = 0  # steps of constant-rows programs (decode, rounds), not prefill chunks
    stage: float = 0.0
    upload: float = 0.0
    launch: float = 0.0
    kernel: float = 0.0
    readback: float = 0.0
    decode_kernel: float = 0.0
    unsettled: list = field(default_factory=list, repr=False)  # (start, end, decode) marks of steps not waited for

    def settle(self, backend) -> None:
        """Add the kernel time of the steps that were not waited for (a non-emitting prefill call
        returns once its launches are issued: waiting only to time them cost every such call the
        kernels' run and a synchronization); call once their work has finished."""
        for start, end, decode in self.unsettled:
            k = backend.elapsed_ms(start, end) / 1000.0
            self.kernel += k
            if decode:
                self.decode_kernel += k
        self.unsettled.clear()

    def add(self, decode: bool, stage: float, upload: float, launch: float, readback: float, kernel: float,
            steps: int = 1) -> None:
        """One launch's times (seconds), of `steps` steps (several decode steps a launch:
        runtime/multistep.py), added field by field: no dict and no attribute lookups by name on the
        step's path (it runs every step, beside 77 microseconds of kernels on an H100)."""
        self.steps += steps
        self.stage += stage
        self.upload += upload
        self.launch += launch
        self.readback += readback
        self.kernel += kernel
        if decode:
            self.decode_steps += steps
            self.decode_kernel += kernel

    def as_dict(self) -> dict[str, float]:
        return {f"rt_{f.name}": getattr(self, f.name) for f in fields(self) if f.name != "unsettled"}
