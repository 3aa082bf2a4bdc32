"""The gateway's one settings object: command-line options and GATEWAY_* environment variables."""

from __future__ import annotations

import secrets
import ssl
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import phonenumbers
from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

Device = Literal["auto", "cpu", "cuda"]
DType = Literal["auto", "float32", "bfloat16", "float16", "int8", "int4"]
LlmKernels = Literal["auto", "vnni", "avx2", "torch"]  # inference.llm.kernel_paths.KERNEL_CHOICES
LiveDelegate = Literal["auto", "every_turn"]  # when a GPT-Live session's model delegates: --live-delegate
# Where a number written without a country code (`(415) 555-0132`) is read as dialled; a `+` number is found
# whatever this says (--safety-phone-region).
DEFAULT_PHONE_REGION = "US"


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "realtime-gateway"


def default_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "realtime-gateway"


EMBEDDED_MODEL_NAME = "smollm2-135m-instruct"


def own_model_name(llm_model: Path | None) -> str:
    """What a model is called when --model-name does not say: a GGUF file's name without .gguf (its metadata's
    general.name often names another build, "... AWQ" in a Q4_K_M file), a folder's name, or the embedded model's."""
    if llm_model is None:
        return EMBEDDED_MODEL_NAME
    path = Path(llm_model).expanduser()
    name = path.stem if path.suffix.lower() == ".gguf" else path.name
    return name or EMBEDDED_MODEL_NAME


class Settings(BaseSettings):
    """Every option is also an environment variable: `--llm-model X` is `GATEWAY_LLM_MODEL=X`."""

    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        extra="ignore",
    )

    # Network
    host: str = Field("127.0.0.1", description="Address to bind. With no API key configured only loopback is allowed.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0 picks a free one).")
    ssl_certfile: Path | None = Field(None, description="PEM certificate: serve https and wss.")
    ssl_keyfile: Path | None = Field(None, description="PEM private key for --ssl-certfile.")
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Accepted API keys (Authorization: Bearer). Comma-separated in the environment. Empty: no auth, loopback only.",
    )
    allow_unauthenticated_public_bind: bool = Field(
        False, description="Allow a non-loopback --host with no API key (not recommended)."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    log_format: Literal["json", "text"] = Field(
        "json", description="json: one JSON object per line (for log pipelines); text: a line a person reads.")
    log_content: bool = Field(
        False, description="Log the users' content (prompts, transcripts, answers) in the event records. "
        "For debugging only: by default the log holds ids, counts, timings and status, never what was said.")

    # Models
    device: Device = Field("auto", description="Where the LLM runs: auto picks cuda when torch sees a GPU, else cpu "
                           "(--asr-device and --tts-device place the voice models).")
    llm_model: Path | None = Field(
        None, description="LLM: a transformers folder or a .gguf file. Default: the embedded SmolLM2-135M-Instruct."
    )
    llm_dtype: DType = Field(
        "auto",
        description="auto: bfloat16 on cuda; on cpu a GGUF file's own types where the engine's kernels run (Q4_0, "
        "Q4_1, Q4_K as 4-bit groups; Q5_0, Q5_1, Q5_K as 5-bit groups; Q6_K, Q8_0 as 8-bit groups; /healthz says "
        "which runs where), else int4 when the weights are 4-bit groups already (a Q4_1 GGUF, such as the embedded "
        "model), else float32. float32 on cpu gives exactly transformers' generate() tokens. "
        "int8 / int4: the linear weights re-quantized at load into 8- or 4-bit groups of 32 (a step and minimum "
        "per group; slightly different tokens), multiplied with 15-bit activations on the engine's AVX512-VNNI or "
        "AVX2 kernels where the CPU runs them; elsewhere int4 runs on torch's kernel with bfloat16 inputs and int8 "
        "as per-channel copies in bfloat16 (/healthz: llm.int8). bfloat16 on a CPU without bfloat16 instructions "
        "(avx512_bf16, amx_bf16) is emulated, many times slower than float32: /healthz llm.bfloat16 and the log say so.",
    )
    llm_kernels: LlmKernels = Field(
        "auto",
        description="Which kernels the LLM runs on a CPU: the engine's own C kernels built for AVX512-VNNI (vnni) or "
        "for AVX2 with FMA and F16C (avx2), or torch's own (torch). auto: the fastest this CPU runs. A build the CPU "
        "cannot run is refused at start; /healthz and the log say what each part runs on.",
    )
    llm_threads: int = Field(0, ge=0, description="torch threads for the LLM (0: all cores).")
    model_name: str = Field(
        "", description="The model id served at /v1/models and accepted in requests. Default: the model's own name, "
        "its file's name without .gguf or its folder's name (smollm2-135m-instruct for the embedded model)."
    )
    model_aliases: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="More names the model answers to in requests, listed at /v1/models (like vLLM's "
        "--served-model-name). Comma-separated in the environment.",
    )
    answer_to_openai_model_names: bool = Field(
        True,
        description="The model also answers to OpenAI's chat and realtime model names (gpt-realtime, gpt-4o-mini, "
        "...: those the installed openai SDK knows), so an app written for OpenAI only changes its base URL.",
    )
    asr_model: str = Field(
        "tiny.en", description="Whisper: tiny.en (the embedded English-only model), base (the embedded multilingual "
        "Whisper base: sessions may name any language, and POST /v1/audio/translations works; it detects the language "
        "and decodes a full 30 s window each call, about 9 times tiny.en's CPU a turn, with no better English: "
        "benchmarks/asr_models.py; joined once from its two PyPI packages into --cache-dir), or the path of a faster-whisper "
        "(CTranslate2) model folder (./base for a folder of that name). /healthz and the log name the model.",
    )
    asr_threads: int = Field(
        1,
        ge=1,
        description="CPU threads for faster-whisper. With 2, merely loading CTranslate2 halved the LLM's decoding "
        "speed on a 2-core CPU, and a 15 s window decodes as fast on 1.",
    )
    asr_workers: int = Field(
        2, ge=1, le=16, description="Whisper calls that may run at once, each on a model replica of its own: the "
        "first worker takes every kind of job, the others final transcripts only, so a session's final waits "
        "neither for a partial transcript already running nor for another session's final.")
    asr_partial_budget: float = Field(
        0.3, gt=0, le=64, description="The share of a core that partial transcripts may take, all sessions together "
        "(a token bucket): past it a partial is dropped, so under load each session's partials come less often "
        "and the final transcripts, the LLM and Piper keep the cores (one session's partials take about 0.12).")
    asr_window_s: float = Field(
        15.0,
        ge=1.0,
        le=30.0,
        description="Whisper input window for utterances that fit (30 = Whisper's own; shorter encodes faster, "
        "and a degenerate result is decoded again over 30 s).",
    )
    asr_partial_window_s: float = Field(
        10.0,
        ge=1.0,
        le=30.0,
        description="Whisper input window for partial transcripts (at most --asr-window-s): on an AVX2 host a "
        "partial costs 0.33 core-seconds on 10 s against 0.44 on 15 s, its words 10% different from the 15 s "
        "decode's (inference/asr.py); a degenerate partial is dropped. Shorter than --asr-window-s, a partial "
        "never stands in for the final transcript.",
    )
    asr_device: Device = Field(
        "auto", description="Where faster-whisper runs: auto picks cuda (float16) when torch and CTranslate2 see a "
        "GPU, else cpu (int8); cuda without one is refused at start.")
    tts_voice: Path | None = Field(
        None, description="Piper voice .onnx (its .onnx.json beside it). Default: the embedded en_US joe-medium."
    )
    tts_voices: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="More installed Piper voices (.onnx, with the .onnx.json beside it) for POST /v1/audio/speech, "
        "named by their file (en_US-amy-medium.onnx: amy); --tts-voice stays the default and the Realtime sessions' "
        "voice. OpenAI's voice names go round the installed voices (GET /v1/audio/voices lists the table). "
        "Comma-separated in the environment.",
    )
    tts_threads: int = Field(1, ge=1, description="onnxruntime threads for Piper.")
    tts_workers: int = Field(
        2, ge=1, le=64, description="Piper syntheses run side by side (threads taking clauses from one queue, the "
        "earliest due first): at 8 voice sessions on 2 cores one thread was 85% busy and first clauses queued "
        "behind it while the cores were 61% used.")
    tts_first_clause_threads: int = Field(
        2,
        ge=1,
        description="onnxruntime threads for a reply's first clause, while the LLM engine waits (capped at the "
        "CPU count; at or below --tts-threads, the first clause is synthesized like the others).",
    )
    tts_device: Device = Field(
        "auto", description="Where Piper runs: auto picks cuda when onnxruntime has its CUDA provider (the "
        "onnxruntime-gpu package installed instead of onnxruntime), else cpu; cuda without it is refused at start.")
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="Where converted model weights are cached and the engine's C kernels are built."
    )
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Where the gateway keeps what must survive a restart: its SQLite database (gateway.db).")
    database_url: str | None = Field(
        None, description="A SQLAlchemy async URL for the conversations, e.g. postgresql+asyncpg://user:pass@host/db "
        "(default: SQLite in --data-dir).")
    load_voice_models: bool = Field(True, description="Load ASR and TTS at start (text-only when false).")

    # LLM engine
    max_batch_size: int = Field(16, ge=1, description="Most requests decoded together in one step.")
    max_queued_requests: int = Field(64, ge=1, description="Admission queue bound; past it requests get 429.")
    prefill_chunk_tokens: int = Field(256, ge=16, description="Most prompt tokens prefilled in one engine step.")
    prefix_cache_mb: int = Field(1024, ge=0, description="Memory budget of the shared prefix KV cache.")
    max_context_tokens: int = Field(0, ge=0, description="Context window used (0: the model's own, capped at 8192).")
    default_max_tokens: int = Field(256, ge=1, description="max_tokens when a request gives none.")
    repetition_penalty: float = Field(1.1, ge=1.0, le=2.0, description="Default repetition penalty.")

    # The LLM on a remote server (inference/llm/remote.py) instead of this process
    llm_backend: str | None = Field(
        None, description="The API root (http(s)://host:port/v1) of an OpenAI-compatible server that runs the LLM: vLLM, "
        "SGLang, another gateway, ... This process then loads only the tokenizer of --llm-model, which must be the "
        "server's model, and renders every prompt itself.")
    llm_backend_flavour: Literal["token", "chat"] = Field(
        "token", description="token: /v1/completions with token-id prompts (vLLM, SGLang, this gateway; prefixes stay "
        "byte-identical, so the server's prefix cache hits); chat: /v1/chat/completions with the rendered messages, "
        "for servers that take no token ids (llama.cpp's server, transformers serve, hosted APIs).")
    llm_backend_model: str | None = Field(None, description="The model name the backend serves (default: --model-name).")
    llm_backend_api_key: str | None = Field(None, description="Bearer key for the backend.")
    llm_routing_header: str = Field(
        "x-conversation-id", min_length=1, description="Header that carries each request's conversation id to the "
        "backend, for a cache-aware router's session affinity (set the router's session key to it).")
    llm_backend_timeout_s: float = Field(
        60.0, gt=0, description="The longest a backend stream may stay silent (its first token included).")
    llm_backend_retries: int = Field(
        2, ge=0, le=10, description="Retries of a backend request that failed before it streamed anything.")
    llm_backend_breaker_failures: int = Field(
        3, ge=1, description="Consecutive backend failures that open the circuit breaker (503 at once).")
    llm_backend_breaker_cooldown_s: float = Field(
        2.0, gt=0, description="How long the open breaker refuses before one request probes the backend again.")
    realtime_temperature: float = Field(
        0.0,
        ge=0.0,
        le=2.0,
        description="Realtime sessions' default temperature. 0 (greedy) for the embedded 135M model: at 0.2 it answered "
        "in garbled French in 2 of 4 three-turn sessions; raise it for bigger models.",
    )
    live_delegate: LiveDelegate = Field(
        "auto", description="GPT-Live sessions with a delegation: `auto`, the live model decides when to call its "
        "delegate tool (as OpenAI's); `every_turn`, each of the user's turns is delegated, the live model only "
        "writing the task, and the voice keeps the conversation going and says the result (a small local voice in "
        "front of a bigger backend or an application's own agent).")
    default_instructions: str = Field(
        "You are a friendly voice assistant. Reply in plain English with one short sentence.",
        description="Realtime sessions' instructions unless the client sets its own.",
    )

    # Limits
    max_request_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Largest HTTP body accepted.")
    max_event_bytes: int = Field(
        15 * 1024 * 1024, ge=1024, description="Largest Realtime event (one WebSocket message) accepted."
    )
    max_transcription_audio_s: float = Field(
        1800.0, gt=0, le=4 * 3600,
        description="Longest audio POST /v1/audio/transcriptions takes (decoded; past it, 400); its file is also held "
        "to --max-request-bytes.")
    max_input_audio_seconds: float = Field(
        120.0, gt=0, description="Cap on the un-committed input audio buffer of a Realtime session."
    )
    max_conversation_items: int = Field(
        2000, ge=1, description="Most items a Realtime session's conversation holds; past it, conversation_full."
    )
    max_conversation_bytes: int = Field(
        8 * 1024 * 1024, ge=1024,
        description="Most bytes of text (UTF-8) a Realtime session's conversation holds; past it, conversation_full.",
    )
    # Safety (gateway/safety/): the policy on what reaches the model and what it says
    safety: bool = Field(
        True, description="Screen every message before the model sees it (typed, transcribed, tool results) and the "
        "model's output as it streams, with the rules below. --no-safety: neither.")
    safety_pii: Literal["redact", "block", "off"] = Field(
        "redact", description="Personal data (e-mail, phone, payment card with a Luhn check, IBAN): redact it (the "
        "model sees [email] ...), block the message (input) or stop the reply (output), or let it through.")
    safety_phone_region: str = Field(
        DEFAULT_PHONE_REGION, description="The country (ISO 3166 code, such as US, GB, FR) whose phone numbers are "
        "found when written without a country code; a number with a + is found whatever this says.")
    safety_denylist: Path | None = Field(
        None, description="A file of denied phrases, one a line (whole words, any case), or `re:` and a regular "
        "expression; `#` comments.")
    safety_denylist_action: Literal["block", "redact"] = Field(
        "block", description="What a denylist match does: block (input refused, output stopped) or redact.")
    safety_classifier: str | None = Field(
        None, description="A classifier beside the rules: a Python entry point (package.module:function, called with "
        "the text, returning a bool or {flagged, categories}) or the URL of an HTTP moderation endpoint in OpenAI's "
        "/v1/moderations shape. It runs beside the generation and a flagged verdict stops the reply.")
    safety_classifier_api_key: str | None = Field(None, description="Bearer key sent to --safety-classifier's URL.")
    safety_classifier_timeout_s: float = Field(
        2.0, gt=0, le=60, description="How long a reply's end waits for the classifier's last verdicts; a late or "
        "failed one lets the reply through (the rules still hold).")
    rate_limit_rpm: int = Field(0, ge=0, description="Requests per minute per API key (0: unlimited).")
    rate_limit_tpm: int = Field(
        0, ge=0, description="Tokens per minute per API key, input plus output (0: unlimited): a chat completion or "
        "Realtime response reserves its prompt plus max_tokens and gives back what it did not generate.")
    max_sessions: int = Field(
        256, ge=1, description="Most Realtime sessions (WebSocket and WebRTC together) this replica holds at once; past "
        "it, 503 with Retry-After, so that a router tries another replica."
    )
    admission_latency_ms: int = Field(
        1000, ge=0, le=60_000, description="Admission by measured capacity: while the 90th percentile of the open "
        "sessions' voice turns of the last --admission-window-s took longer than this (or than 1.5x a lone "
        "session's turns, where that is more) from the end of the user's speech to the reply's first audio (the "
        "VAD's silence wait not counted), a new Realtime session gets 503 server_at_capacity with Retry-After, and "
        "the sessions already open keep their speed; with no session open one is always taken (0: no bound).")
    admission_window_s: float = Field(
        30, ge=1, le=3600, description="The window of recent voice turns that --admission-latency-ms judges.")
    max_sessions_per_key: int = Field(
        256,
        ge=1,
        description="Most sessions one API key (with its client secrets) has open at once, on all replicas with "
        "--redis-url; past it, 429. Lower it when several keys share the gateway, so that one cannot take every "
        "session.",
    )
    session_seat_ttl_s: float = Field(
        15, ge=1, le=600, description="With --redis-url: how long a session's seat outlives its replica's last "
        "refresh (refreshed every third of it), so a crashed replica's sessions stop counting for their key.")
    max_session_duration_s: float = Field(
        3600, gt=0, description="Longest a Realtime session lasts (OpenAI's is 60 minutes): then an error event "
        "session_expired and the close. Its session object's expires_at says when.")
    session_idle_timeout_s: float = Field(
        900, ge=0, description="A Realtime session with no client event and no response for this long gets an error "
        "event session_idle_timeout and is closed (0: never).")
    max_client_secrets_per_key: int = Field(
        128, ge=1, description="Most client secrets one API key has minted and not yet used (nor seen expire); past it, 429."
    )
    http_keep_alive_s: int = Field(5, ge=1, description="An idle keep-alive HTTP connection is closed after this long.")
    http_head_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A request's line and headers must arrive within this long of the connection being ready for "
        "them (opened, or done with its previous request), or it is closed.",
    )
    idempotency_ttl_s: float = Field(600.0, gt=0, description="How long Idempotency-Key answers are kept.")
    resume_window_s: float = Field(
        60.0, ge=0, le=3600,
        description="A Realtime session whose connection drops (no close frame) keeps running this long, waiting "
        "for its client to resume it (?resume=<token>&last_sequence=<n>). 0: a dropped connection ends its session.")
    resume_buffer_bytes: int = Field(
        16 * 1024 * 1024, ge=64 * 1024,
        description="Most bytes of sent events each session keeps for a resume; older ones cannot be replayed.")

    # Several replicas
    redis_url: str | None = Field(
        None, description="Redis (redis://host:6379/0) for what replicas share: client secrets (single use across "
        "replicas), Idempotency-Key answers, rate-limit buckets and the replica directory. Without it, they live in "
        "this process (and its database).")
    replica_id: str = Field(
        default_factory=lambda: secrets.token_hex(3), pattern=r"^[a-z0-9]{1,16}$",
        description="This replica's id, carried in its call ids and resume tokens (default: random).")
    replica_url: str | None = Field(
        None, description="The URL other replicas reach this one at (http://10.0.0.3:8000), announced in Redis so that "
        "a hangup or a resume sent to another replica is forwarded here.")
    drain_timeout_s: float = Field(
        20.0, ge=0, description="On SIGTERM: how long replies in flight may take to finish before the remaining "
        "sessions are closed with a hand-off (their conversation stored, to go on on another replica).")

    # WebRTC
    client_secret_ttl_s: int = Field(600, ge=10, le=7200, description="Lifetime of ephemeral client secrets.")
    ice_host_addresses: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host addresses offered as ICE candidates (empty: the machine's interfaces). Add 127.0.0.1 for loopback.",
    )
    ice_servers: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="STUN/TURN URLs (turn:user:pass@host:port). None by default."
    )

    # Phone calls over SIP (gateway/api/transports/sip_trunk.py)
    sip_listen: str | None = Field(
        None, description="host:port where a SIP trunk reaches the gateway (UDP and TCP), for example 0.0.0.0:5060. "
        "Each INVITE is announced to --webhook-url as realtime.call.incoming and answered by "
        "/v1/realtime/calls/{call_id}/accept or /reject. Off by default.")
    sip_advertise_ip: str | None = Field(
        None, description="The address put in the SDP answer and Contact (the gateway's public address behind NAT). "
        "Default: --sip-listen's host, which must then not be a wildcard.")
    sip_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["127.0.0.0/8", "::1/128"],
        description="The networks (CIDRs, comma-separated) whose INVITEs are taken: the carrier's signalling addresses. "
        "Any other source gets 403 and no webhook. Default: loopback only.")
    sip_tls_cert: Path | None = Field(
        None, description="A PEM certificate (chain) for SIP over TLS, which then listens on the port after "
        "--sip-listen's (5061 beside 5060). With --sip-tls-key. SDES keys (SRTP) are secret only over TLS.")
    sip_tls_key: Path | None = Field(None, description="The PEM private key of --sip-tls-cert.")
    sip_auth: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="USER:PASSWORD pairs (comma-separated) an INVITE must answer a digest "
        "challenge (401) for, on top of --sip-allow; a wrong answer gets 403 and no webhook. Off by default: the "
        "allowed networks alone decide.")
    sip_auth_realm: str = Field("gateway", min_length=1, pattern=r'^[^"\\]+$',
                                description="The realm of --sip-auth's challenges.")
    sip_answer_timeout_s: float = Field(
        20.0, gt=0, le=300, description="A call the application neither accepts nor rejects within this long is "
        "rejected (480 Temporarily Unavailable), as is one whose webhook could not be delivered by then.")
    sip_rtp_ports: str = Field(
        "20000-29999", pattern=r"^\d{4,5}-\d{4,5}$",
        description="The UDP port range calls' RTP and RTCP are bound in (an even port and the next).")
    sip_invites_per_minute: int = Field(
        120, ge=1, description="New INVITEs taken from one source address per minute; more get 503 with Retry-After. With "
        "--sip-auth a call's challenged INVITE and its answer count as two.")
    webhook_url: str | None = Field(
        None, description="Where realtime.call.incoming is POSTed (the application's endpoint). Needed by --sip-listen.")
    webhook_secret: str | None = Field(
        None, description="The whsec_ secret the webhooks are signed with, the Standard Webhooks way, which the "
        "openai SDK's client.webhooks.unwrap() checks. Needed by --sip-listen.")

    # Turn taking
    webrtc_audio_reorder_frames: int = Field(
        1,
        ge=1,
        le=8,
        description="Incoming WebRTC audio packets wait for this many later ones before decoding (reordering "
        "on a bad link). aiortc's default is 4: 80 ms before the VAD hears anything; 1 waits 20 ms.",
    )
    vad_silence_duration_ms: int = Field(
        400, ge=100, le=5000, description="Sessions' default server_vad silence_duration_ms (clients can change it)."
    )
    turn_model: Path | None = Field(
        None, description="The audio end-of-turn model (ONNX, Smart Turn v3's inputs and output) that semantic_vad "
        "asks when the user pauses. Default: smart-turn-v3.2-cpu, which the pipecat-ai wheel carries.",
    )
    server_vad_turn_model: bool = Field(
        False, description="server_vad asks the end-of-turn model too: a turn it hears unfinished waits semantic_vad's "
        "longest silence (2 s) instead of silence_duration_ms.",
    )
    resume_false_interruptions: bool = Field(
        True, description="WebRTC and GPT-Live: speech over a reply pauses its audio; a backchannel (\"mm-hm\", "
        "\"yeah\"), a cough or nothing Whisper can read lets it play on from there, words addressed to the assistant "
        "(or speech voiced for over 1.2 s) interrupt it, decided on the speech's first short silence whatever the turn "
        "detector. Off: any speech interrupts at once (as over a WebSocket, where the client plays the audio).",
    )
    voice_preemption: bool = Field(
        True,
        description="Generate the reply (and speak its first clause) from the speculative transcript while the VAD "
        "waits out the silence; the turn's response adopts it when the final transcript is the same.",
    )
    echo_guard_ms: int = Field(
        300, ge=0, description="After playback starts, VAD speech alone does not interrupt for this long."
    )
    min_barge_in_speech_ms: int = Field(
        160, ge=0, description="Speech must last this long before it interrupts the assistant."
    )

    @model_validator(mode="after")
    def _served_name(self) -> Settings:
        if not self.model_name.strip():
            self.model_name = own_model_name(self.llm_model)
        return self

    def sip_passwords(self) -> dict[str, str]:
        """--sip-auth as user: password."""
        return dict(pair.split(":", 1) for pair in self.sip_auth)  # type: ignore[misc]  # checked: two parts each

    @model_validator(mode="after")
    def _sip_trunk(self) -> Settings:
        """The trunk's options hold together at start, not at the first call."""
        if self.sip_listen is None:
            return self
        host, _, port = self.sip_listen.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("--sip-listen must be host:port, such as 0.0.0.0:5060")
        try:
            listen_ip = ip_address(host.strip("[]"))
        except ValueError:
            raise ValueError("--sip-listen's host must be an IP address (0.0.0.0 for every interface)") from None
        if self.sip_advertise_ip is None and listen_ip.is_unspecified:
            raise ValueError("--sip-listen on a wildcard address needs --sip-advertise-ip, the address callers reach")
        if self.webhook_url is None or self.webhook_secret is None:
            raise ValueError("--sip-listen needs --webhook-url and --webhook-secret: every call is announced there")
        if not self.webhook_secret.startswith("whsec_"):
            raise ValueError("--webhook-secret must be a whsec_ secret (base64 after the prefix)")
        low, high = (int(part) for part in self.sip_rtp_ports.split("-"))
        if not 1024 <= low < high <= 65535:
            raise ValueError("--sip-rtp-ports must be a range of ports above 1023, such as 20000-29999")
        if (self.sip_tls_cert is None) != (self.sip_tls_key is None):
            raise ValueError("--sip-tls-cert and --sip-tls-key go together")
        if int(port) == 65535 and self.sip_tls_cert is not None:
            raise ValueError("SIP over TLS listens on the port after --sip-listen's, which has none")
        if self.sip_tls_cert is not None:
            self.sip_tls_context()  # a missing file, a key of another certificate: said at start
        return self

    def sip_tls_context(self) -> ssl.SSLContext:
        """The TLS server context of --sip-tls-cert and --sip-tls-key."""
        assert self.sip_tls_cert is not None and self.sip_tls_key is not None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.sip_tls_cert, self.sip_tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--sip-tls-cert/--sip-tls-key cannot be loaded: {exc}") from None
        return context

    @field_validator("sip_auth")
    @classmethod
    def _sip_users(cls, value: list[str]) -> list[str]:
        for pair in value:
            user, _, password = pair.partition(":")
            if not user or not password:
                raise ValueError("each --sip-auth entry must be USER:PASSWORD")
        return value

    @field_validator("sip_allow")
    @classmethod
    def _sip_networks(cls, value: list[str]) -> list[str]:
        for network in value:
            ip_network(network, strict=False)  # a ValueError names the bad one
        return value

    @field_validator("safety_phone_region")
    @classmethod
    def _phone_region(cls, value: str) -> str:
        if value.upper() not in phonenumbers.SUPPORTED_REGIONS:
            raise ValueError("must be a country's ISO 3166 code that phonenumbers knows, such as US, GB or FR")
        return value.upper()

    @field_validator("asr_model", mode="before")
    @classmethod
    def _asr_model(cls, value: object) -> object:
        if isinstance(value, Path):
            return str(value)
        if value is None or (isinstance(value, str) and not value.strip()):
            return "tiny.en"
        return value

    @field_validator("llm_backend")
    @classmethod
    def _backend_url(cls, value: str | None) -> str | None:
        url = urlsplit(value) if value is not None else None
        if url is not None and (url.scheme not in ("http", "https") or not url.netloc):
            raise ValueError("must be an http(s) URL of the server's API root, such as http://10.0.0.5:8000/v1")
        return value

    @field_validator("tts_voices")
    @classmethod
    def _voice_names(cls, value: list[Path], info: ValidationInfo) -> list[Path]:
        from gateway.platform.voices import VoiceCatalog

        VoiceCatalog.from_paths(info.data.get("tts_voice"), value)  # two voices of one name: refused at start
        return value

    @field_validator("api_keys", "model_aliases", "ice_host_addresses", "ice_servers", "tts_voices", "sip_allow",
                     "sip_auth", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


def is_loopback(host: str) -> bool:
    return host in {"localhost", "::1"} or host.startswith("127.")
