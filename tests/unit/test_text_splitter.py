import pytest

from inference.text import ClauseSplitter, clean_for_speech


def feed(text: str, step: int = 1, splitter: ClauseSplitter | None = None) -> list[str]:
    """Streams the text in small deltas, as an LLM does, then flushes."""
    s = splitter or ClauseSplitter()
    out: list[str] = []
    for i in range(0, len(text), step):
        out += s.push(text[i : i + step])
    return out + s.flush()


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_sentences(step: int) -> None:
    assert feed("Paris is the capital. It is in France! Is it big? Yes.", step) == [
        "Paris is the capital.",
        "It is in France!",
        "Is it big?",
        "Yes.",
    ]


def test_a_sentence_is_released_as_soon_as_the_next_character_confirms_it() -> None:
    s = ClauseSplitter()
    assert s.push("Hello there.") == []  # could still be "there.com"
    assert s.push(" How") == ["Hello there."]
    assert s.flush() == ["How"]


def test_first_chunk_may_end_at_a_clause_once_it_has_four_words() -> None:
    assert feed("Well, the capital of France, as you know, is Paris. And the rest, of it, follows.") == [
        "Well, the capital of France,",
        "as you know, is Paris.",
        "And the rest, of it, follows.",
    ]


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_a_first_chunk_without_punctuation_ends_before_a_phrase_past_eight_words(step: int) -> None:
    assert feed("The tallest mountain on Earth is Mount Everest which rises far above the clouds.", step) == [
        "The tallest mountain on Earth is Mount Everest",
        "which rises far above the clouds.",
    ]
    # No phrase opener within reach: after the eighth word.
    assert feed("Red green blue yellow purple orange pink brown black white.", step) == [
        "Red green blue yellow purple orange pink brown",
        "black white.",
    ]


def test_a_short_first_chunk_waits_for_its_last_word_and_leaves_later_sentences_whole() -> None:
    s = ClauseSplitter()
    assert s.push("one two three four five six seven eight nine") == []  # "nine" may go on: "ninety"
    assert s.push(" ten") == ["one two three four five six seven eight"]
    later = "nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen"
    assert s.push(f" {later} ") == []  # only a first chunk is cut short
    assert s.flush() == [f"nine ten {later}"]


def test_later_chunks_cut_clauses_only_when_long() -> None:
    long_clause = "this clause keeps going on and on with many words that make it long enough to pass the limit of one hundred and twenty characters"
    text = f"Short start here. Then {long_clause}, and more words. Done."
    out = feed(text)
    assert out == ["Short start here.", f"Then {long_clause},", "and more words.", "Done."]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Ask Dr. Smith about it. He knows.", ["Ask Dr. Smith about it.", "He knows."]),
        ("Bring fruit, e.g. apples, and i.e. nothing else. Thanks.", ["Bring fruit, e.g. apples,", "and i.e. nothing else.", "Thanks."]),
        ("Yes. Pi is about 3.14 and e is 2.72 or so. Right.", ["Yes.", "Pi is about 3.14 and e is 2.72 or so.", "Right."]),
        ("J. R. R. Tolkien wrote it. Yes.", ["J. R. R. Tolkien wrote it.", "Yes."]),
        ("It costs 5. Then we go.", ["It costs 5.", "Then we go."]),
        ("Wait... what? Oh!", ["Wait...", "what?", "Oh!"]),
        ('He said "stop." Then left.', ['He said "stop."', "Then left."]),
        ("The price is 1,000 dollars today.", ["The price is 1,000 dollars today."]),
    ],
)
def test_abbreviations_decimals_and_quotes(text: str, expected: list[str]) -> None:
    assert feed(text) == expected


def test_newlines_cut_and_list_numbers_are_not_sentences() -> None:
    assert feed("Here are two:\n1. Paris\n2. Lyon\n") == ["Here are two:", "1. Paris", "2. Lyon"]


def test_markdown_noise_is_stripped() -> None:
    assert feed("# Title\n**Paris** is the `capital`.\n- *first* point\n---\n") == [
        "Title",
        "Paris is the capital.",
        "first point",
    ]


def test_run_on_text_is_cut_at_a_space() -> None:
    words = " ".join(["word"] * 100)
    out = feed(words, splitter=ClauseSplitter(max_chars=100))
    assert all(len(chunk) <= 100 for chunk in out)
    assert " ".join(out) == words


def test_a_run_without_spaces_is_cut_at_the_limit_not_held_to_the_end() -> None:
    splitter = ClauseSplitter(max_chars=100)
    out = splitter.push("7" * 250)
    assert out == ["7" * 100, "7" * 100]  # spoken while the reply goes on
    assert splitter.flush() == ["7" * 50]


def test_flush_resets_for_the_next_response() -> None:
    s = ClauseSplitter()
    assert s.push("One two three four, five. ") == ["One two three four,", "five."]
    assert s.flush() == []
    # First-chunk rule applies again.
    assert s.push("Again one two three, four") == ["Again one two three,"]


def test_reset_drops_pending_text() -> None:
    s = ClauseSplitter()
    s.push("half a sent")
    s.reset()
    assert s.flush() == []


def test_clean_for_speech() -> None:
    assert clean_for_speech("  **bold**   and __under__  ") == "bold and under"
    assert clean_for_speech("***") == ""
    assert clean_for_speech("?!") == ""


@pytest.mark.parametrize("text", [
    "One two three four five six seven eight nine ten, eleven twelve.",
    "Well, I think so.",
    "A mountain is a large landform that rises above the land around it, usually with a peak.",
    "Sure! Here are three colours: red, green and blue.",
])
def test_the_chunks_do_not_depend_on_how_the_text_is_split_into_deltas(text: str) -> None:
    """A reply generated ahead (token by token) and its replay (one delta) must give the same first chunk."""
    chunks = feed(text, 1000)
    for step in (1, 2, 3, 5):
        assert feed(text, step) == chunks
