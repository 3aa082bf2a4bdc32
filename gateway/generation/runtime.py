"""The models every session shares: loaded once, in the background, while /healthz says 503."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from gateway.generation.service import Generator
from gateway.platform import metrics
from gateway.platform.admission import VoiceAdmission
from gateway.platform.config import Settings
from gateway.platform.heap import HeapTrimmer
from gateway.platform.model_names import ModelNames, openai_transcription_names
from gateway.platform.voices import VoiceCatalog
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import SpeechOptions
from gateway.safety.hooks import Classifier, load_classifier
from gateway.safety.policy import SafetyPolicy
from gateway.safety.rules import build_policy
from inference.llm.remote_probe import BackendMisconfigured
from inference.models import (
    ModelNotFound,
    ModelPaths,
    asr_device,
    asr_model_name,
    load_on,
    resolve_device,
    resolve_model_paths,
    tts_device,
)

if TYPE_CHECKING:
    from inference.asr import AsrEngine
    from inference.llm.backend import LLMBackend
    from inference.llm.end_of_turn import EndOfTurnModel
    from inference.tts import TtsEngine
    from inference.turn_end import TurnEndModel

log = logging.getLogger(__name__)


@dataclass
class LoadTimes:
    llm_s: float = 0.0
    asr_s: float = 0.0
    tts_s: float = 0.0
    total_s: float = 0.0
    llm_converted: bool = False


@dataclass
class Runtime:
    settings: Settings
    device: Literal["cpu", "cuda"] = "cpu"
    paths: ModelPaths | None = None
    engine: LLMBackend | None = None
    end_of_turn: EndOfTurnModel | None = None  # semantic_vad's judge, on the engine
    asr: AsrEngine | None = None
    turn_end: TurnEndModel | None = None  # semantic_vad's audio judge (and server_vad's, if asked)
    tts: TtsEngine | None = None
    load_error: str | None = None
    load_times: LoadTimes = field(default_factory=LoadTimes)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    # The Silero file each band's sessions run: "wideband" (browsers, programs), "narrowband" (phone calls' G.711).
    vad_models: dict[str, Path] = field(default_factory=dict)
    # Silero VAD for every session, one window batch per hop; kept apart from the model executors.
    vad_executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="vad")
    )
    # noise_reduction for every session that asks for it: DeepFilterNet, about 2 ms of a core per 20 ms frame each.
    denoise_executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="denoise")
    )
    # Open sessions, and the heap given back once none is left (the app's shutdown closes it).
    heap: HeapTrimmer = field(default_factory=HeapTrimmer)
    model_names: ModelNames = field(init=False)  # what requests may call the LLM
    voices: VoiceCatalog = field(init=False)  # the installed voices' names, known before they load
    safety: SafetyPolicy = field(init=False)  # the rules on input and output (gateway/safety/)
    classifier: Classifier | None = field(init=False)  # --safety-classifier, beside the rules (safety/hooks.py)
    admission: VoiceAdmission = field(init=False)  # new sessions refused while voice turns run slow (admission.py)

    def __post_init__(self) -> None:
        settings = self.settings
        self.model_names = ModelNames(settings.model_name, settings.model_aliases, settings.answer_to_openai_model_names)
        self.voices = VoiceCatalog.from_paths(settings.tts_voice, list(settings.tts_voices))  # names checked by Settings
        self.safety = build_policy(settings)  # DenylistError (a ValueError): a file it cannot use
        self.classifier = (load_classifier(settings.safety_classifier, settings.safety_classifier_api_key,
                                           settings.safety_classifier_timeout_s)
                           if settings.safety and settings.safety_classifier else None)
        self.admission = VoiceAdmission(settings.admission_latency_ms / 1000, settings.admission_window_s)

    @property
    def speech_options(self) -> SpeechOptions:
        """The voice models' names for session validation (known from the settings before they load)."""
        settings = self.settings
        voices = self.voices
        voice = voices.default
        asr_name = asr_model_name(settings.asr_model)  # whisper-tiny.en, whisper-base, or a folder's name
        from inference.asr import whisper_languages  # faster-whisper's, imported once the ASR loads

        if self.asr is not None:
            language = self.asr.language
        else:  # not loaded yet: English-only models say so in their name, as Whisper's do
            language = "en" if asr_name.endswith(".en") else None
        return SpeechOptions(voice=voice, voice_aliases=voices.aliases_of(voice), transcription_model=asr_name,
                             transcription_aliases=openai_transcription_names(), transcription_language=language,
                             transcription_languages=whisper_languages())

    @property
    def devices(self) -> dict[str, str]:
        """Where each loaded model runs (/healthz, the start-up log): ASR with CTranslate2's compute type."""
        found: dict[str, str] = {}
        if self.engine is not None:
            found["llm"] = "remote" if self.settings.llm_backend else self.device
        if self.asr is not None:
            found["asr"] = f"{self.asr.device}/{self.asr.compute_type}"
        if self.tts is not None:
            found["tts"] = self.tts.device
        return found

    @property
    def voice_ready(self) -> bool:
        return self.asr is not None and self.tts is not None

    def require_ready(self) -> None:
        """503 until the models are loaded (or for good, when they failed to)."""
        if self.load_error:
            raise ApiError("model_load_failed", f"The models failed to load: {self.load_error}", type="server_error",
                           status=503)
        if not self.ready.is_set() or self.engine is None:
            raise ApiError("model_not_ready", "The models are still loading; retry shortly.", type="server_error",
                           status=503, retry_after_s=2.0)

    def require_model(self, model: str, param: str = "model") -> None:
        if model not in self.model_names:
            raise ApiError(
                "model_not_found",
                f"The model '{model}' does not exist. Available: '{self.settings.model_name}'.",
                param,
                status=404,
            )

    def generator(self) -> Generator:
        """The generation service on the loaded model (503 until it is)."""
        self.require_ready()
        assert self.engine is not None
        return Generator(self.engine, self.safety, self.classifier, self.settings.safety_classifier_timeout_s)

    async def load(self) -> None:
        """Load the three models side by side in worker threads; never raises (see load_error)."""
        started = time.monotonic()
        try:
            self.device = resolve_device(self.settings.device)
            # A thread: --asr-model base joins its two parts into --cache-dir on the first start (about a second).
            self.paths = await asyncio.to_thread(resolve_model_paths, self.settings.llm_model, self.settings.asr_model,
                                                 self.settings.tts_voice, cache_dir=self.settings.cache_dir)
            from inference.llm.threads import run_in_own_thread

            if self.settings.load_voice_models:
                # Before the loads run side by side: it sets OMP_NUM_THREADS for a moment (inference/asr.py).
                from inference.asr import import_ctranslate2
                from inference.turn_end import import_feature_extractor

                await asyncio.to_thread(import_ctranslate2, self.settings.asr_threads)
                await asyncio.to_thread(import_feature_extractor)
            # Its own thread, which exits: torch work there must not leave an OpenMP pool behind.
            loads = [run_in_own_thread(self._load_llm)]
            if self.settings.load_voice_models:
                loads += [asyncio.to_thread(self._load_asr), asyncio.to_thread(self._load_tts)]
            await asyncio.gather(*loads)
        except BackendMisconfigured as exc:  # one line says what to set
            log.error("%s", exc)
            self.load_error = str(exc)
            return
        except Exception as exc:  # a failed load is reported by /healthz, not by a crash
            from inference.llm.model_support import UnsupportedModel  # (torch: imported by the load anyway)

            if isinstance(exc, UnsupportedModel):  # one line says what the file is and what runs
                log.error("model loading failed: %s", exc)
            else:
                log.exception("model loading failed")
            self.load_error = f"{type(exc).__name__}: {exc}"
            return
        self._yield_partials()
        self.load_times.total_s = time.monotonic() - started
        log.info(
            "models ready in %.1f s (llm %.1f s%s, asr %.1f s, tts %.1f s) on %s",  # llm cpu, asr cpu/int8, ...
            self.load_times.total_s,
            self.load_times.llm_s,
            ", converted from GGUF" if self.load_times.llm_converted else "",
            self.load_times.asr_s,
            self.load_times.tts_s,
            ", ".join(f"{model} {device}" for model, device in self.devices.items()),
        )
        self.ready.set()

    def _yield_partials(self) -> None:
        """Partial transcripts are optional work: the ASR drops one that is due while a listener waits for speech
        or a reply waits for its first token (inference/asr.py)."""
        from inference.llm.engine import LLMEngine

        asr, tts, engine = self.asr, self.tts, self.engine
        if asr is None:
            return
        llm_waits = engine.awaiting_first_token if isinstance(engine, LLMEngine) else None
        speech_waits = tts.speech_overdue if tts is not None else None
        asr.partials_yield_to = lambda: bool((speech_waits and speech_waits()) or (llm_waits and llm_waits()))

    def _load_llm(self) -> None:
        if self.settings.llm_backend:
            self._connect_remote_llm()
            return
        from inference.llm.end_of_turn import EndOfTurnModel
        from inference.llm.engine import EngineConfig, LLMEngine
        from inference.llm.loader import load_lm

        assert self.paths is not None
        lm = load_lm(
            self.paths.llm,
            device=self.device,
            dtype=self.settings.llm_dtype,
            cache_dir=self.settings.cache_dir,
            threads=self.settings.llm_threads,
            max_context_tokens=self.settings.max_context_tokens,
            kernels=self.settings.llm_kernels,
        )
        self.load_times.llm_s = lm.load_seconds
        self.load_times.llm_converted = lm.converted
        engine = LLMEngine(
            lm,
            EngineConfig(
                max_batch_size=self.settings.max_batch_size,
                max_queued_requests=self.settings.max_queued_requests,
                prefill_chunk_tokens=self.settings.prefill_chunk_tokens,
                prefix_cache_bytes=self.settings.prefix_cache_mb * 1024 * 1024,
            ),
        )
        if lm.weight_format != "native":
            # The engine multiplies its quantized copies; nothing in the gateway calls the model itself.
            freed = engine.fwd.release_model_weights()
            if freed:  # a GGUF file's own types never had float copies of its layers
                log.info("released %.0f MiB of the model's float weights (the engine runs %s copies)", freed / 2**20,
                         lm.weight_format)
        described = engine.fwd.describe()
        log.info("the LLM runs on: %s", ", ".join(f"{k} {v}" for k, v in described.items()))
        if described.get("bfloat16", "native") != "native":
            log.warning("the LLM computes in bfloat16 on this CPU, %s (/healthz llm.bfloat16)", described["bfloat16"])
        engine.step_observer = metrics.BATCH_SIZE.observe
        engine.start()
        metrics.ENGINE.stats = engine.stats
        self.engine = engine
        self.end_of_turn = EndOfTurnModel(engine)

    def _connect_remote_llm(self) -> None:
        """The LLM on a remote server: only the tokenizer loads here. semantic_vad's end-of-turn judge needs the
        first step's token probabilities, which such servers do not return: without it semantic_vad waits each
        eagerness' longest silence."""
        from inference.llm.loader import load_tokenizer_model
        from inference.llm.remote import RemoteBackend, RemoteConfig
        from inference.llm.remote_probe import probe_backend

        settings = self.settings
        assert self.paths is not None and settings.llm_backend is not None
        started = time.monotonic()
        lm = load_tokenizer_model(self.paths.llm, cache_dir=settings.cache_dir,
                                  max_context_tokens=settings.max_context_tokens)
        self.load_times.llm_s = time.monotonic() - started
        config = RemoteConfig(
            url=settings.llm_backend, flavour=settings.llm_backend_flavour,
            model=settings.llm_backend_model or settings.model_name, api_key=settings.llm_backend_api_key,
            routing_header=settings.llm_routing_header, read_timeout_s=settings.llm_backend_timeout_s,
            retries=settings.llm_backend_retries, breaker_failures=settings.llm_backend_breaker_failures,
            breaker_cooldown_s=settings.llm_backend_breaker_cooldown_s, max_in_flight=settings.max_batch_size + settings.max_queued_requests,
        )
        # BackendMisconfigured: the gateway never becomes ready (load_error), rather than fail every request.
        backend = RemoteBackend(lm, probe_backend(config, lm.tokenizer.encode("Hi", add_special_tokens=False)[0]))
        log.info("the LLM runs on %s (%s flavour); prompts are rendered here with %s's tokenizer",
                 settings.llm_backend, backend.config.flavour, self.paths.llm.name)
        metrics.ENGINE.stats = backend.stats
        self.engine = backend

    def _load_asr(self) -> None:
        from inference.asr import AsrEngine
        from inference.models import embedded_turn_model, narrowband_vad_path, silero_vad_path
        from inference.turn_end import TurnEndModel
        from media.vad import SileroVad

        assert self.paths is not None
        paths, settings = self.paths, self.settings
        self.asr = load_on(settings.asr_device, asr_device(settings.asr_device, settings.asr_threads), lambda device: AsrEngine.load(
            paths.asr, device=device, threads=settings.asr_threads, window_s=settings.asr_window_s,
            partial_window_s=settings.asr_partial_window_s,
            partial_budget=settings.asr_partial_budget, workers=settings.asr_workers), "faster-whisper")
        metrics.ASR.stats = self.asr.stats
        self.load_times.asr_s = self.asr.load_seconds
        log.info("the ASR runs %s (%s, %s) from %s on %s/%s", paths.asr_name,
                 "multilingual" if self.asr.multilingual else "English only",
                 f"language {self.asr.language}" if self.asr.language else "detects the language", paths.asr,
                 self.asr.device, self.asr.compute_type)
        self.vad_models = {"wideband": silero_vad_path()}
        try:
            self.vad_models["narrowband"] = narrowband_vad_path()
        except ModelNotFound as missing:
            self.vad_models["narrowband"] = self.vad_models["wideband"]
            log.warning("phone calls' VAD runs faster-whisper's Silero v6, which misses much of a caller's G.711 "
                        "speech: %s", missing)
        for path in set(self.vad_models.values()):
            SileroVad(path)  # loads the ONNX session every session's VAD of that file shares
        log.info("the VAD runs %s; phone calls %s", self.vad_models["wideband"].name, self.vad_models["narrowband"].name)
        try:
            turn_model = settings.turn_model or embedded_turn_model()
        except ModelNotFound as missing:  # not a declared dependency (see the Makefile): the LLM judges alone
            log.warning("semantic_vad runs without its audio end-of-turn model: %s", missing)
            return
        self.turn_end = TurnEndModel.load(turn_model)  # a --turn-model that is not there fails the start

    def _load_tts(self) -> None:
        from inference.tts import TtsEngine

        assert self.paths is not None
        voices = self.voices
        for path in self.settings.tts_voices:
            if not path.exists() or not path.with_name(path.name + ".json").exists():
                raise ModelNotFound(f"TTS voice {path} (or its {path.name}.json) not found")
        paths, settings = self.paths, self.settings
        self.tts = load_on(settings.tts_device, tts_device(settings.tts_device), lambda device: TtsEngine.load(
            paths.tts_model,
            paths.tts_config,
            threads=settings.tts_threads,
            first_clause_threads=min(settings.tts_first_clause_threads, os.cpu_count() or 1),
            voice_name=voices.default,
            other_voices=list(zip(voices.installed[1:], settings.tts_voices)),
            device=device,
            workers=settings.tts_workers,
        ), "Piper")
        self.load_times.tts_s = self.tts.load_seconds

    def close(self) -> None:
        for component in (self.engine, self.asr, self.tts, self.turn_end):
            if component is not None:
                component.close()
        self.vad_executor.shutdown(wait=False, cancel_futures=True)
        self.denoise_executor.shutdown(wait=False, cancel_futures=True)
