"""benchmarks/overlap.py's pure parts: what an event log says speech over a reply did, and the reply's pause read
from the arrival times of its loud frames."""

from __future__ import annotations

import pytest

from benchmarks.overlap import (
    busy_share,
    classify,
    hold_silence,
    natural_silences,
    pause_between,
    pause_estimate,
    percentiles,
    reply_pause_totals,
    silences,
    summarize,
    user_turns,
)

REPLY = "resp_1"


def committed(item: str) -> dict:
    return {"type": "input_audio_buffer.committed", "item_id": item}


def test_a_deleted_turn_with_the_reply_not_cut_played_on() -> None:
    events = [{"type": "input_audio_buffer.speech_started"}, committed("item_u"),
              {"type": "conversation.item.input_audio_transcription.completed", "transcript": "Yeah."},
              {"type": "conversation.item.deleted", "item_id": "item_u"},
              {"type": "response.done", "response": {"id": REPLY, "status": "completed"}}]
    assert classify(events, REPLY) == "played_on"


def test_a_cleared_playout_or_a_cancelled_reply_is_cut_even_if_the_turn_was_deleted() -> None:
    cleared = [committed("item_u"), {"type": "output_audio_buffer.cleared", "response_id": REPLY},
               {"type": "conversation.item.deleted", "item_id": "item_u"}]
    assert classify(cleared, REPLY) == "cut"
    cancelled = [committed("item_u"), {"type": "response.done", "response": {"id": REPLY, "status": "cancelled"}}]
    assert classify(cancelled, REPLY) == "cut"


def test_another_response_cancelled_or_another_item_deleted_does_not_count() -> None:
    events = [committed("item_u"), {"type": "response.done", "response": {"id": "resp_2", "status": "cancelled"}},
              {"type": "conversation.item.deleted", "item_id": "item_other"}]
    assert classify(events, REPLY) == "no_verdict"
    assert classify([{"type": "input_audio_buffer.speech_started"}], REPLY) == "no_turn"


def test_user_turns_count_the_commits() -> None:
    assert user_turns([committed("a"), {"type": "input_audio_buffer.speech_started"}, committed("b")]) == 2
    assert user_turns([]) == 0


def frames(start: float, stop: float, step: float = 0.02) -> list[float]:
    return [round(start + i * step, 3) for i in range(round((stop - start) / step))]


def test_silences_are_the_gaps_between_loud_frames_and_after_the_last() -> None:
    loud = frames(0, 1) + frames(1.5, 2)  # 1.0 .. 1.5 silent (the frame at 0.98 sounds until 1.0)
    runs = silences(loud, until=2.5)
    assert [(round(a, 3), round(b, 3)) for a, b in runs] == [(1.0, 1.5), (2.0, 2.5)]
    assert silences([0.0, 0.02, 0.045, 0.06], until=0.08) == []  # arrival jitter is not silence


def test_the_hold_is_the_longest_silence_in_the_window_taken_whole() -> None:
    # reply audio, a natural 0.2 s pause at 1.2, the hold 2.0 .. 5.5 (it starts inside the 3 s from the onset at
    # 1.5 and is taken whole, past 4.5), then audio again until 10.
    loud = frames(0, 1.2) + frames(1.4, 2.0) + frames(5.5, 10)
    length, end, censored = hold_silence(loud, onset=1.5, until=10)
    assert (round(length, 3), round(end, 3), censored) == (3.5, 5.5, False)
    # the recording ended inside it
    length, end, censored = hold_silence(frames(0, 2.0), onset=1.5, until=4.0)
    assert (round(length, 2), censored) == (2.0, True)
    assert hold_silence(frames(2, 3), onset=1.5, until=4) is None  # no reply audio before the clip
    assert hold_silence(frames(0, 5), onset=1.5, until=5) == (0.0, 1.5, False)


def test_natural_silences_take_the_longest_in_each_whole_stretch_after_the_hold() -> None:
    # after 5.5: pauses of 0.3 and 0.1 s in the first 3 s, 0.5 s in the next, the partial stretch left out
    loud = frames(5.5, 6.5) + frames(6.8, 8.0) + frames(8.1, 9.0) + frames(9.5, 11.6) + frames(11.9, 12.0)
    assert [round(s, 3) for s in natural_silences(loud, after=5.5)] == [0.3, 0.5]
    assert natural_silences([], after=0) == []
    assert pause_estimate(0.9, 0.3) == pytest.approx(0.6)
    assert pause_estimate(0.2, 0.3) == 0.0


def test_percentiles_are_nearest_rank() -> None:
    assert percentiles([]) == {"p50": None, "p95": None, "n": 0}
    values = [float(i) for i in range(1, 21)]
    assert percentiles(values) == {"p50": 10.5, "p95": 19.0, "n": 20}
    assert percentiles([0.4]) == {"p50": 0.4, "p95": 0.4, "n": 1}


METRICS = """# HELP gateway_reply_pause_seconds How long a reply's audio was held
# TYPE gateway_reply_pause_seconds histogram
gateway_reply_pause_seconds_bucket{le="1.0",outcome="resumed"} 1.0
gateway_reply_pause_seconds_bucket{le="+Inf",outcome="resumed"} 2.0
gateway_reply_pause_seconds_count{outcome="resumed"} 2.0
gateway_reply_pause_seconds_sum{outcome="resumed"} 1.5
"""


def test_the_metric_difference_is_the_hold() -> None:
    before = reply_pause_totals(METRICS)
    assert before == {"resumed": (1.5, 2.0)}
    after = reply_pause_totals(METRICS.replace("count{outcome=\"resumed\"} 2.0", "count{outcome=\"resumed\"} 3.0")
                               .replace("sum{outcome=\"resumed\"} 1.5", "sum{outcome=\"resumed\"} 2.25"))
    assert pause_between(before, after) == {"resumed": 0.75, "holds": 1}
    assert pause_between(before, before) == {}
    assert reply_pause_totals("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.0\n") is None
    assert pause_between(None, None) is None


def test_summarize_counts_the_rows_and_estimates_the_pause_against_the_natural_silence() -> None:
    trials = {
        "backchannel": [
            {"outcome": "played_on", "raw_silence_s": 1.0, "natural_silences_s": [0.2, 0.3, 0.4],
             "metric_pause_s": None},
            {"outcome": "cut", "metric_pause_s": None},
            {"outcome": "no_turn", "raw_silence_s": 0.2, "natural_silences_s": [0.3], "metric_pause_s": None},
            {"error": "the reply never started"},
        ],
        "interruption": [{"outcome": "cut"}, {"outcome": "played_on"}],
        "paused": [{"turns": 1}, {"turns": 2}],
    }
    rows = summarize(trials)
    assert rows["backchannels_cut_the_reply"] == "1 of 3"
    assert rows["backchannels_played_on"] == "1 of 3"
    assert rows["interruptions_cut_the_reply"] == "1 of 2"
    assert rows["pauses_kept_one_turn"] == "1 of 2"
    assert rows["pauses_ended_early"] == "1 of 2"
    assert rows["errors"] == 1
    pause = rows["backchannel_pause_s"]
    assert pause["natural_silence_s"] == 0.3
    assert pause["audio"] == {"p50": 0.35, "p95": 0.7, "n": 2}  # 1.0 - 0.3, and 0.2 - 0.3 -> 0
    assert pause["metric"] is None


def test_the_machine_busy_share_is_the_busy_jiffies_over_all() -> None:
    assert busy_share((100, 1000), (400, 1400)) == 0.75
    assert busy_share(None, (1, 2)) is None
    assert busy_share((1, 2), (1, 2)) is None
