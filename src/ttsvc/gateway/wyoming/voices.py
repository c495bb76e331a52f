"""The voices the Wyoming server describes (``info``) and resolves a request's voice to.

Apart from the listener (``server``) and a connection (``handler``), which both use it: the
served voices' Piper configs, read once per engine version, tell each voice's language and
speakers.
"""

from __future__ import annotations

from dataclasses import dataclass

from wyoming.info import Attribution, Info, TtsProgram, TtsVoice, TtsVoiceSpeaker
from wyoming.tts import SynthesizeVoice

from ttsvc import __version__
from ttsvc.errors import UnknownVoice
from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.state import GatewayState
from ttsvc.voice import describe

PIPER_URL = "https://github.com/OHF-Voice/piper1-gpl"


@dataclass(frozen=True)
class Voice:
    """A request's voice resolved: the served voice and its speaker id."""

    name: str
    speaker: int | None


class WyomingVoices:
    """The served voices as Wyoming sees them."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    async def info(self) -> Info:
        """Every voice served now, the default first, with its language and speakers."""
        catalog, default = self.state.catalog, self.state.voice
        served = catalog.serving() if catalog is not None else {}
        voices = []
        for name in sorted(served, key=lambda n: (n != default, n)):
            spec = served[name]
            about = describe(await self.state.voice_config(spec))
            language = about["language"]
            assert isinstance(language, dict)
            code = language.get("code") or language.get("espeak_voice") or "und"
            speakers = about["speakers"]
            assert isinstance(speakers, list)
            many = isinstance(about["num_speakers"], int) and about["num_speakers"] > 1
            details = (language.get("name") or code, about["quality"])
            voices.append(TtsVoice(
                name=name, attribution=Attribution(name="Piper", url=PIPER_URL), installed=True,
                description=f"{name} ({', '.join(str(x) for x in details if x)})",
                version=spec.label, languages=[str(code)],
                speakers=[TtsVoiceSpeaker(str(s)) for s in speakers] if many else None,
            ))  # fmt: skip
        program = TtsProgram(
            name="ttsvc", attribution=Attribution(name="ttsvc", url=""), installed=True,
            description="ttsvc streaming text to speech", version=__version__, voices=voices,
            supports_synthesize_streaming=True,
        )  # fmt: skip
        return Info(tts=[program])

    async def resolve(self, wanted: SynthesizeVoice | None, caller: Caller | None = None) -> Voice:
        """The served voice and speaker a request names (by name, else by language), checked
        as ``/synthesize`` checks them: an unknown voice or speaker is the same error, and a
        voice still being verified is waited for as there (``caller``: its record names it)."""
        name = None if wanted is None else wanted.name
        if wanted is not None and name is None and wanted.language:
            name = await self._by_language(wanted.language)
        voice = await self.state.resolve_voice(name, caller)
        spoken = None if wanted is None else wanted.speaker
        return Voice(voice, await self.state.speaker_of(voice, spoken))

    async def _by_language(self, language: str) -> str:
        """The default voice if it speaks ``language`` (``en_US``, ``en-us`` or ``en``), else the
        first served voice that does."""
        catalog = self.state.catalog
        served = catalog.serving() if catalog is not None else {}

        def norm(code: str) -> str:
            return code.replace("-", "_").lower()

        wanted = norm(language)
        for name in sorted(served, key=lambda n: (n != self.state.voice, n)):
            code = describe(await self.state.voice_config(served[name]))["language"]
            assert isinstance(code, dict)
            spoken = norm(str(code.get("code") or code.get("espeak_voice") or ""))
            if spoken == wanted or spoken.split("_")[0] == wanted:
                return name
        raise UnknownVoice(f"no served voice speaks {language!r}", field="voice")
