"""faster-whisper's long-form transcription, with a window that fails every temperature kept, not dropped.

Whisper decodes each 30 s window greedily, and where the text compresses like a loop (compression ratio
above 2.4) or is unlikely (average log-probability below -1) samples it again at rising temperatures.
Where every temperature fails, it keeps the best sample by log-probability; where a sample is unlikely
and the window's no-speech probability is high, it takes the window for silence and skips it. Both
dropped real speech (issue 28): six sentences that differ only in their number compress like a loop, so
the greedy decode, which was right, failed; the samples were noise, and the first 30 s came back as
nothing at all (espeak-ng) or as one word (Piper).

Here the greedy decode is kept wherever the samples did no better: where it is likely (above the
log-probability threshold) and ended by itself rather than running to the token limit or repeating a
sentence back to back, as a decoder loop does. It keeps the fallback's last temperature, as faster-whisper
does for a window where all failed, so that the next window's prompt is reset; its segments report its
compression ratio, which says that it failed that threshold. Elsewhere the choice is Whisper's own.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from faster_whisper import WhisperModel

from inference.transcript_checks import repeats_a_sentence

log = logging.getLogger(__name__)

Decode = tuple[Any, float, float, float]  # (ctranslate2 result, avg log-probability, temperature, compression ratio)


class KeepingWhisperModel(WhisperModel):  # type: ignore[misc]
    def generate_with_fallback(self, encoder_output: Any, prompt: list[int], tokenizer: Any, options: Any) -> Decode:
        first, *rest = options.temperatures
        if first != 0.0 or not rest:  # no greedy decode to fall back from
            return super().generate_with_fallback(encoder_output, prompt, tokenizer, options)  # type: ignore[no-any-return]
        # The greedy decode, then the samples, each through faster-whisper's own loop: the same decodes
        # and the same choices as one pass over all temperatures, but the greedy decode stays at hand.
        greedy = super().generate_with_fallback(encoder_output, prompt, tokenizer, dataclasses.replace(options, temperatures=[first]))
        if not _failed(greedy, options):
            return greedy  # it met the thresholds, or is silence by Whisper's own test: nothing falls back
        sampled = super().generate_with_fallback(encoder_output, prompt, tokenizer, dataclasses.replace(options, temperatures=rest))
        if not _failed(sampled, options) and not _silence(sampled, options):
            return sampled  # a sample met every threshold
        if self._trusted(greedy, prompt, tokenizer, options):
            log.info("a window failed every temperature (compression ratio %.2f): its greedy decode is kept", greedy[3])
            return greedy[0], greedy[1], sampled[2], greedy[3]
        if _silence(sampled, options):
            return sampled
        # Every temperature failed: Whisper's choice, the likeliest of those below the compression threshold.
        ratio = options.compression_ratio_threshold
        candidates = [d for d in (greedy, sampled) if ratio is None or d[3] <= ratio] or [greedy, sampled]
        best = max(candidates, key=lambda d: d[1])
        return best[0], best[1], sampled[2], best[3]

    def _trusted(self, decode: Decode, prompt: list[int], tokenizer: Any, options: Any) -> bool:
        result, avg_logprob, _temperature, _ratio = decode
        if options.log_prob_threshold is not None and avg_logprob < options.log_prob_threshold:
            return False
        tokens = result.sequences_ids[0]
        limit = len(prompt) + options.max_new_tokens if options.max_new_tokens is not None else self.max_length
        return len(prompt) + len(tokens) < limit and not repeats_a_sentence(tokenizer.decode(tokens))


def _failed(decode: Decode, options: Any) -> bool:
    """Whether a decode fails a threshold that makes Whisper fall back."""
    _result, avg_logprob, _temperature, ratio = decode
    if _silence(decode, options):  # Whisper stops there whatever the compression ratio
        return False
    if options.compression_ratio_threshold is not None and ratio > options.compression_ratio_threshold:
        return True
    return options.log_prob_threshold is not None and avg_logprob < options.log_prob_threshold


def _silence(decode: Decode, options: Any) -> bool:
    """Whisper's silence: a high no-speech probability and an unlikely decode (the window is skipped)."""
    result, avg_logprob, _temperature, _ratio = decode
    return (options.no_speech_threshold is not None and options.log_prob_threshold is not None
            and result.no_speech_prob > options.no_speech_threshold and avg_logprob < options.log_prob_threshold)
