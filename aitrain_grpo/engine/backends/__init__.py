"""Generation backends behind one interface: token ids in, sampled token ids and log-probabilities out.

`base.py` holds the interface; `hf.py` generates with the training model itself. The vLLM backends
(colocated and server) plug in behind the same `GenerationBackend` protocol; `choice.py` builds the
one a run or an evaluation asks for.
"""

from aitrain_grpo.engine.backends.base import GenerationBackend, Sample, SamplingParams

__all__ = ["GenerationBackend", "Sample", "SamplingParams"]
