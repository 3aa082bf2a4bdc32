"""The multi-voice turn-taking set (benchmarks/turn_taking_set.py) and the benchmark's replay of the barge-in rule
and its calibration (benchmarks/turn_taking.py): their structure, with no model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.turn_taking import (
    Decision,
    Heard,
    OverReply,
    Silence,
    Verdict,
    calibrate,
    decide,
    text_shortest_sweep,
    turn_end,
)
from benchmarks.turn_taking_set import (
    BACKCHANNELS,
    COMPLETE,
    COUGHS,
    HUMANS,
    INTERRUPTIONS,
    NOISES,
    NOISY_COUNT,
    PAUSED,
    PIPER,
    RATE,
    TRAIL_S,
    _cough,
    _rng,
    _trail,
    build,
    missing_source,
    recordings,
    voice_names,
)
from benchmarks.voice_audio import speech_span
from benchmarks.voices import EspeakSpeaker, espeak_available


@pytest.mark.skipif(not espeak_available(), reason="espeak-ng is not installed (.ci/run installs it)")
def test_an_espeak_voice_speaks_every_kind_with_its_pauses_where_they_are_said() -> None:
    voice = EspeakSpeaker("en-gb-scotland", 210)
    utterances = build(voice, seed=1)
    counts = {kind: sum(u.kind == kind for u in utterances)
              for kind in ("complete", "paused", "backchannel", "interruption", "noisy")}
    assert counts == {"complete": len(COMPLETE), "paused": len(PAUSED), "backchannel": len(BACKCHANNELS) + COUGHS,
                      "interruption": len(INTERRUPTIONS), "noisy": NOISY_COUNT}
    assert {u.voice for u in utterances} == {voice.name}
    assert sum(u.kind == "backchannel" and not u.text for u in utterances) == COUGHS
    for u in utterances:
        assert u.pcm.dtype == np.int16
        assert len(u.pcm) - u.speech_end == pytest.approx(TRAIL_S * RATE, abs=RATE // 50)
        assert speech_span(u.pcm[:u.speech_end], RATE)[1] > 0
        if u.kind != "noisy":
            assert not u.pcm[u.speech_end:].any()  # silence after the speech
    paused = [u for u in utterances if u.kind == "paused"]
    for u, (text, pause_ms) in zip(paused, PAUSED, strict=True):
        assert u.pause is not None and "," not in u.text.split(" ")[0] and u.text == text.replace(",", "", 1)
        start, end = u.pause
        assert end - start == RATE * pause_ms // 1000  # exactly as long as said
        assert not u.pcm[start:end].any()
        # Speech right up to the pause and right after it: the pause is where it is said to be, no longer.
        assert speech_span(u.pcm[start - RATE // 20:start], RATE)[1] > 0
        assert speech_span(u.pcm[end:end + RATE // 10], RATE)[1] > 0
    assert {p for _, p in PAUSED} >= {700, 800}
    noisy = [u for u in utterances if u.kind == "noisy"]
    assert [u.noise for u in noisy] == [NOISES[i % len(NOISES)] for i in range(NOISY_COUNT)]
    for u in noisy:
        assert u.clean is not None and u.pcm[u.speech_end:].any()  # the noise goes on after the speech
    # Deterministic: espeak-ng says a text the same every time, and the coughs and the noise come from the seed
    # and the voice's name.
    assert np.array_equal(voice.say(COMPLETE[0], RATE).pcm, voice.say(COMPLETE[0], RATE).pcm)
    cough = next(u for u in utterances if u.kind == "backchannel" and not u.text)
    assert np.array_equal(cough.pcm[:cough.speech_end], _trail(_cough(_rng(1, voice.name)))[0][:cough.speech_end])


def test_the_human_recordings_are_complete_utterances_and_short_interruptions_each_voice_its_own() -> None:
    utterances, missing = recordings()
    for u in utterances:
        assert u.kind in ("complete", "interruption", "noisy") and u.voice in HUMANS and u.text
        assert speech_span(u.pcm[:u.speech_end], RATE)[1] > 0
        if u.kind != "noisy":
            assert not u.pcm[u.speech_end:].any()
    assert len({u.voice for u in utterances}) + len(missing) == len(HUMANS)
    for name in HUMANS:
        assert (missing_source(name) is None) == any(u.voice == name for u in utterances)
    assert voice_names()[0] == PIPER and set(HUMANS) <= set(voice_names())


def _heard(at: float, text: str, logprob: float) -> Heard:
    return Heard(at, text, logprob, 300.0, 400.0)


def test_the_barge_in_replay_decides_on_words_length_and_confidence() -> None:
    yeah = OverReply("v", "backchannel", "Yeah.", 1000.0,
                     [("hold", 1000.0, None), ("judged", 1500.0, _heard(1500.0, "Yeah.", -0.3))],
                     _heard(float("nan"), "Yeah.", -0.3))
    assert decide(yeah, -0.8) == decide(yeah) and decide(yeah, -0.8).paused_ms == 500.0
    assert not decide(yeah, -0.8).stopped
    # A backchannel heard as other words: it stops the reply unless Whisper is unsure of them.
    misheard = OverReply("v", "backchannel", "Mm-hm.", 1000.0,
                         [("hold", 1000.0, None), ("judged", 1600.0, _heard(1600.0, "and the MHCM.", -1.3))],
                         _heard(float("nan"), "and the MHCM.", -1.3))
    assert not decide(misheard, -0.8).stopped and decide(misheard, -1.4).stopped
    # "Yeah, right.": speech again after "Yeah." was judged (400 ms voiced) holds the reply again once it is
    # voiced the re-hold length more; both pauses count. Its words are judged whether held or not.
    twice = OverReply("v", "backchannel", "Yeah, right.", 1000.0,
                      [("hold", 1000.0, None), ("judged", 1400.0, _heard(1400.0, "Yeah.", -0.2)),
                       ("speech", 1500.0, 432.0), ("speech", 1520.0, 464.0), ("speech", 1560.0, 560.0),
                       ("judged", 1900.0, _heard(1900.0, "Yeah, right.", -0.2))],
                      _heard(float("nan"), "Yeah, right.", -0.2))
    assert decide(twice, rehold_ms=0.0).paused_ms == 800.0 and not decide(twice, rehold_ms=0.0).stopped
    assert decide(twice, rehold_ms=50.0).paused_ms == 780.0
    assert decide(twice, rehold_ms=200.0).paused_ms == 400.0 and decide(twice, rehold_ms=200.0).resumed_ms == 1400.0
    # The gap a listener hears: from the end of their word to the reply's last return.
    twice.speech_end_ms = 1800.0
    assert decide(twice, rehold_ms=0.0).resumed_ms == 1900.0
    # "Okay, but ...": the rest's words stop the reply whether it was held again or not.
    but = OverReply("v", "interruption", "Okay, but what about tomorrow?", 1000.0,
                    [("hold", 1000.0, None), ("judged", 1400.0, _heard(1400.0, "Okay.", -0.2)),
                     ("speech", 1500.0, 432.0), ("judged", 2300.0, _heard(2300.0, "Okay, but what about", -0.3))],
                    _heard(float("nan"), "Okay, but what about tomorrow?", -0.2))
    assert decide(but, rehold_ms=0.0) == Decision(True, "words", 1200.0, 2300.0, "Okay, but what about")
    assert decide(but, rehold_ms=math.inf) == Decision(True, "words", 400.0, 2300.0, "Okay, but what about")
    long = OverReply("v", "interruption", "Hold on, I have a question.", 1000.0,
                     [("hold", 1000.0, None), ("length", 2100.0, None)], _heard(float("nan"), "Hold on", -2.0))
    assert decide(long, 0.0) == decide(long, -5.0) and decide(long).how == "length"
    unsure = OverReply("v", "interruption", "Tell me more.", 1000.0,
                       [("hold", 1000.0, None), ("judged", 1500.0, _heard(1500.0, "tell me more", -1.0))],
                       _heard(float("nan"), "tell me more", -1.0))
    assert not decide(unsure, -0.8).stopped and decide(unsure, -1.2).stopped
    command = OverReply("v", "interruption", "Wait.", 1000.0,
                        [("hold", 1000.0, None), ("judged", 1500.0, _heard(1500.0, "wait", -1.9))],
                        _heard(float("nan"), "wait", -1.9))
    assert decide(command, -0.5).stopped and decide(command, -2.0).stopped  # a command, however unsure
    never = OverReply("v", "cough", "", None, [], _heard(float("nan"), "", None))  # type: ignore[arg-type]
    assert decide(never).how == "never paused" and not decide(never).stopped
    found = calibrate([misheard, unsure, yeah])
    assert found["fewest_errors"] == 0 and found["best_range"] == [-1.3, -1.0]
    assert found["proposed_threshold"] == pytest.approx(-1.15) and found["margin"] == pytest.approx(0.15)



def _silence(start: float, last: float, audio: float, text: float, avg_logprob: float) -> Silence:
    return Silence(start, start + 64.0, last, Verdict(audio, 0.05, text, 0.15, "words", avg_logprob))


def test_a_turn_ends_in_the_first_silence_that_lasts_what_its_judges_ask() -> None:
    """The replay of session_config.turn_end_wait_ms over recorded silences: a mid-thought pause of 700 ms whose
    misheard first half sounds finished ends the turn when Whisper was sure of the words, not when it was unsure;
    server_vad ends it after 400 ms whatever was said; the judges' own time counts."""
    sure = [_silence(1000.0, 1700.0, audio=0.9, text=0.6, avg_logprob=-0.3), _silence(2500.0, 5000.0, 0.9, 0.9, -0.2)]
    unsure = [_silence(1000.0, 1700.0, audio=0.9, text=0.6, avg_logprob=-1.0), sure[1]]
    assert turn_end(sure, "semantic_vad_audio_text", "auto").end_ms == 1250.0  # 250 ms: both judges agree
    assert turn_end(unsure, "semantic_vad_audio_text", "auto").end_ms == 2750.0  # the pause outlasted
    assert turn_end(unsure, "server_vad", "auto").end_ms == 1400.0
    slow = [Silence(1000.0, 1064.0, 5000.0, Verdict(0.9, 0.5, 0.9, 0.8, "words", -0.2))]
    assert turn_end(slow, "semantic_vad_audio_text", "auto").end_ms == 1864.0  # when the slower judge answered
    assert turn_end([], "server_vad", "auto").end_ms is None


def _silence_row(start: float, last: float, audio: float, text: float) -> dict[str, object]:
    return {"start_ms": start, "judged_ms": start + 64.0, "last_ms": last, "audio": audio, "audio_s": 0.05,
            "text": text, "text_s": 0.15, "heard": "words", "avg_logprob": -0.2}


def test_the_llms_shortest_wait_is_replayed_on_recorded_silences() -> None:
    """text_shortest_sweep: finished words in audio the audio model hears unfinished end the turn after the LLM's
    shortest wait, so a shorter one ends a complete turn sooner and a 300 ms pause it reads as finished early."""
    finished = _silence_row(1000.0, 4000.0, audio=0.2, text=0.9)
    records = [
        {"voice": "espeak", "kind": "complete", "text": "t", "speech_end_ms": 1000.0, "pause_ms": None,
         "silences": [finished]},
        {"voice": "espeak", "kind": "paused", "text": "t", "speech_end_ms": 2000.0, "pause_ms": (1000.0, 1300.0),
         "silences": [_silence_row(1000.0, 1300.0, audio=0.2, text=0.9), {**finished, "start_ms": 2000.0,
                                                                           "judged_ms": 2064.0}]},
        {"voice": "piper", "kind": "complete", "text": "t", "speech_end_ms": 1000.0, "pause_ms": None,
         "silences": [_silence_row(1000.0, 4000.0, audio=0.9, text=0.9)]},
    ]
    sweep = {row["text_shortest_ms"]: row for row in text_shortest_sweep(records, "auto", "piper")}
    assert sweep[250]["current"] and not sweep[400]["current"]
    slow, now = sweep[400]["voices_other_than_the_output_voice"], sweep[250]["voices_other_than_the_output_voice"]
    assert (slow["end_of_turn_delay_p50_ms"], slow["mid_thought_pauses_ended_early_pct"]) == (400.0, 0.0)
    assert (now["end_of_turn_delay_p50_ms"], now["mid_thought_pauses_ended_early_pct"]) == (250.0, 100.0)
    assert sweep[400]["per_voice"]["piper"]["end_of_turn_delay_p50_ms"] == 250.0  # the audio model's own shortest
