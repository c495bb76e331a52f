"""Phoneme ids against the reference phonemizer the voice was trained with.

The reference is piper-phonemize's own pipeline on the same normalized text: espeak-ng's sentence
split and the C++ id mapping (``phoneme_ids_espeak``), independent of our Python id mapping and
segmentation.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from piper_phonemize import phoneme_ids_espeak, phonemize_espeak

from ttsvc.errors import UnspeakableText
from ttsvc.text.frontend import TextFrontEnd
from ttsvc.text.normalize import normalize
from ttsvc.text.phonemize import _ESPEAK, EspeakProcess, phoneme_ids, phonemize
from ttsvc.voice import VoiceConfig

CORPUS = [
    line
    for line in (Path(__file__).parent / "corpus.txt").read_text(encoding="utf-8").splitlines()
    if line.strip()
]


def test_corpus_is_large_and_varied() -> None:
    assert len(CORPUS) >= 50
    assert any(ch.isdigit() for line in CORPUS for ch in line)
    assert sum(line.endswith("?") for line in CORPUS) >= 5


@pytest.mark.parametrize("text", CORPUS)
def test_ids_match_reference_phonemizer(text: str, voice_config: VoiceConfig) -> None:
    ours = [list(s.ids) for s in TextFrontEnd(voice_config).sentences(text)]
    reference = [phoneme_ids_espeak(p) for p in phonemize_espeak(normalize(text), "en-us")]
    # espeak-ng reports a closing quote after "?" as an empty sentence (BOS, pad, EOS only);
    # Piper would synthesize a blip of silence for it, we drop it
    assert ours == [ids for ids in reference if len(ids) > 3]


def test_id_rules_bos_pad_eos(voice_config: VoiceConfig) -> None:
    id_map = voice_config.phoneme_id_map
    ids = phoneme_ids(["h", "a"], id_map)
    pad = id_map["_"][0]
    assert ids == [id_map["^"][0], pad, id_map["h"][0], pad, id_map["a"][0], pad, id_map["$"][0]]


def test_unknown_phoneme_is_dropped(voice_config: VoiceConfig) -> None:
    id_map = voice_config.phoneme_id_map
    assert phoneme_ids(["h", "\u4e16"], id_map) == phoneme_ids(["h"], id_map)


def test_espeak_is_guarded_across_threads() -> None:
    """espeak-ng is not re-entrant: concurrent callers must each get their own sentence's result."""
    texts = [f"Sentence number {w}." for w in ("one", "two", "three", "four")] * 5
    expected = {t: phonemize(t, "en-us") for t in set(texts)}
    results: dict[int, list[list[str]]] = {}

    def work(i: int, text: str) -> None:
        results[i] = phonemize(text, "en-us")

    threads = [threading.Thread(target=work, args=(i, t)) for i, t in enumerate(texts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[i] == expected[t] for i, t in enumerate(texts))


def test_a_crashing_text_fails_alone_and_the_next_call_works() -> None:
    """Raw text, no normalization: espeak-ng really crashes on it, in the child process only."""
    expected = phonemize("Still here.", "en-us")
    first_child = _ESPEAK.pid
    with pytest.raises(UnspeakableText) as excinfo:
        phonemize("a." * 90, "en-us")
    assert excinfo.value.status == 422 and excinfo.value.field == "text"
    assert excinfo.value.type == "unspeakable_text"
    assert phonemize("Still here.", "en-us") == expected
    assert _ESPEAK.pid not in (None, first_child)  # a fresh child took over


def test_a_hung_phonemizer_fails_the_call_and_is_replaced() -> None:
    espeak = EspeakProcess(call_timeout_s=0.5)
    try:
        expected = espeak.sentences("Hello there.", "en-us")
        hung = espeak.pid
        assert hung is not None
        os.kill(hung, signal.SIGSTOP)  # a real hang: the child never answers
        with pytest.raises(UnspeakableText):
            espeak.sentences("Hello there.", "en-us")
        assert not Path(f"/proc/{hung}").exists()  # killed and reaped, not left stopped
        assert espeak.sentences("Hello there.", "en-us") == expected
    finally:
        espeak.close()


def test_crashes_do_not_disturb_other_threads() -> None:
    """The compute loop and staging threads share one child: a crash between their calls must
    not hand anyone a wrong answer or an error that was not theirs."""
    texts = [f"Sentence number {w}." for w in ("one", "two", "three")] * 4
    expected = {t: phonemize(t, "en-us") for t in set(texts)}
    results: dict[int, object] = {}

    def work(i: int, text: str) -> None:
        try:
            results[i] = phonemize(text, "en-us")
        except UnspeakableText as exc:
            results[i] = exc

    poison = [threading.Thread(target=work, args=(-i - 1, "b." * 90)) for i in range(3)]
    threads = [threading.Thread(target=work, args=(i, t)) for i, t in enumerate(texts)]
    everyone = threads[:3] + poison + threads[3:]
    for t in everyone:
        t.start()
    for t in everyone:
        t.join()
    assert all(isinstance(results[-i - 1], UnspeakableText) for i in range(3))
    assert all(results[i] == expected[t] for i, t in enumerate(texts))


def test_espeak_is_not_loaded_into_the_calling_process() -> None:
    code = (
        "import sys\n"
        "from ttsvc.text.phonemize import phonemize\n"
        "assert phonemize('Hello.', 'en-us')\n"
        "assert 'piper_phonemize' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_child_killed_between_calls_is_replaced_without_failing_a_text() -> None:
    espeak = EspeakProcess()
    try:
        expected = espeak.sentences("Hello there.", "en-us")
        killed = espeak.pid
        assert killed is not None
        exited = os.pidfd_open(killed)  # readable once the process has exited
        os.kill(killed, signal.SIGKILL)
        assert select.select([exited], [], [], 30)[0]
        os.close(exited)
        assert espeak.sentences("Hello there.", "en-us") == expected
        assert espeak.pid != killed
    finally:
        espeak.close()


RELAYED = """
import sys
from ttsvc.observability.logs import capture_stray_output, configure_logging
from ttsvc.text.phonemize import close_phonemizer, phonemize
configure_logging("info", sys.stdout, "json")
relay = capture_stray_output(native=True)
phonemize("Hello there.", "en-us")  # starts the espeak-ng child: it inherits fd 2, the relay pipe
close_phonemizer()
sys.exit(0 if relay.close() else 3)
"""


def test_a_process_ending_with_a_relay_of_stderr_is_not_held_by_its_espeak_child() -> None:
    """The worker's exit: its relay of file descriptor 2 reaches the pipe's end once the
    espeak-ng child, which holds a write end too, is stopped first (else the relay waited out
    its timeout and the gateway killed the worker a second into every shutdown)."""
    result = subprocess.run([sys.executable, "-c", RELAYED], capture_output=True, text=True,
                            timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
