"""The streaming synthesizer, in modules of one concern each.

``params`` (request parameters), ``steps`` (the engine runs a stream yields and the audio it
makes), ``synthesizer`` (text to streamed PCM: the stream), ``units`` (what a stream says, in
order: plain text and SSML scripts alike), ``frame_steps`` (a sentence's windows as engine
calls, stateful or context engines), ``calibration`` (what the engines cost here) and
``canary`` (the check an engine set passes before it serves). Everything public is imported
here, so callers import from ``ttsvc.synthesis``.
"""

from ttsvc.synthesis.canary import CANARY_TEXT, canary_failure
from ttsvc.synthesis.params import SynthesisParams
from ttsvc.synthesis.steps import Answer, AudioChunk, FrameCall, Pcm16, Steps, drive, to_pcm16
from ttsvc.synthesis.synthesizer import ESTIMATE_MARGIN, FLOW_CHUNK, Synthesizer

__all__ = [
    "CANARY_TEXT",
    "ESTIMATE_MARGIN",
    "FLOW_CHUNK",
    "Answer",
    "AudioChunk",
    "FrameCall",
    "Pcm16",
    "Steps",
    "SynthesisParams",
    "Synthesizer",
    "canary_failure",
    "drive",
    "to_pcm16",
]
