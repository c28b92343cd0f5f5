"""autolade.hf: lookahead as a transformers custom_generate method (callable and folder forms).

Fast tests use tiny random models with a character-level tokenizer (96 characters = the tiny
vocab), so stop strings, streamers, chat templates and pipelines run for real; the slow ones
compare with model.generate on SmolLM2 and Gemma 3 in fp32.
"""

from __future__ import annotations

import threading

import pytest
import torch
from test_sampling import ALPHA, K, chi_square_p, exact_joint, peaky
from tiny import hf_greedy, repetitive_prompt, tiny_gemma3, tiny_llama
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import GenerationConfig, PreTrainedTokenizerFast, TextIteratorStreamer, pipeline
from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList, StopStringCriteria
from transformers.generation.streamers import BaseStreamer
from transformers.generation.utils import GenerateDecoderOnlyOutput

import autolade
import autolade.hf
from autolade.config import LookaheadConfig
from autolade.errors import AutoladeError, ConfigError, InputError
from autolade.hf import _Tracker
from autolade.workloads import encode_prompt, load_workload

CHARS = [chr(c) for c in range(32, 127)] + ["\n"]  # 96 tokens: the tiny models' vocab
W2 = dict(window=2, ngram=3, guesses=2)  # explicit lookahead settings (window + pool + prompt lookup)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run on one thread


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    """One token per character, with a chat template: decode(encode(text)) == text."""
    raw = Tokenizer(models.WordLevel(vocab={c: i for i, c in enumerate(CHARS)}, unk_token="?"))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    raw.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="?")
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    return tokenizer


@pytest.fixture(scope="module")
def model():
    m = tiny_llama()
    m.generation_config.pad_token_id = 0
    return m


@pytest.fixture(scope="module")
def ids():
    return repetitive_prompt()


class Recorder(BaseStreamer):
    """Records put() and end() calls."""

    def __init__(self) -> None:
        self.calls: list = []

    def put(self, value):
        self.calls.append(value.tolist())

    def end(self):
        self.calls.append("end")

    def new_tokens(self) -> list[int]:
        assert self.calls[-1] == "end" and self.calls.count("end") == 1
        return [t for c in self.calls[1:-1] for t in c]


def _new(out: torch.Tensor, ids: torch.Tensor) -> list[int]:
    return out[0, ids.shape[1] :].tolist()


# --- greedy exactness ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings", [W2, dict(config=LookaheadConfig(window=0, prompt_lookup=8)), {}], ids=["W2N3G2", "lookup", "resolved"]
)
def test_greedy_equals_model_generate(model, ids, settings):
    ref = hf_greedy(model, ids, 40)
    stats = []
    out = model.generate(ids, max_new_tokens=40, custom_generate=autolade.hf.lookahead, lookahead_on_stats=stats.append, **settings)
    assert _new(out, ids) == ref
    direct = autolade.generate(model, ids, max_new_tokens=40, **settings)
    assert stats[0].settings == direct.stats.settings and stats[0].settings_source == direct.stats.settings_source
    if settings:
        assert stats[0].tokens_per_step > 1.0, "drafts must be accepted, so several tokens commit per step"


def test_greedy_gemma3_sliding_window_and_generation_config():
    m = tiny_gemma3()
    ids = repetitive_prompt(length=40)
    ref = hf_greedy(m, ids, 30)  # 88 + 30 tokens: past the sliding window of 16
    gc = GenerationConfig(max_new_tokens=30, do_sample=False, pad_token_id=0)
    out = m.generate(ids, generation_config=gc, custom_generate=autolade.hf.lookahead, **W2)
    assert _new(out, ids) == ref


def test_return_dict_holds_sequences_only(model, ids):
    out = model.generate(ids, max_new_tokens=12, custom_generate=autolade.hf.lookahead, return_dict_in_generate=True, **W2)
    assert isinstance(out, GenerateDecoderOnlyOutput)
    assert _new(out.sequences, ids) == hf_greedy(model, ids, 12)
    assert out.scores is None and out.logits is None and out.past_key_values is None


def test_eos_in_the_middle(model, ids):
    ref = hf_greedy(model, ids, 30)
    eos = ref[6]
    hf = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=False, eos_token_id=eos)
    ours = model.generate(ids, max_new_tokens=30, custom_generate=autolade.hf.lookahead, eos_token_id=eos, **W2)
    assert ours.tolist() == hf.tolist()
    assert ours.shape[1] - ids.shape[1] <= 7 and ours[0, -1] == eos


def test_repetition_penalty_greedy(model, ids):
    hf = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False, repetition_penalty=1.3)
    ours = model.generate(ids, max_new_tokens=20, custom_generate=autolade.hf.lookahead, repetition_penalty=1.3, **W2)
    assert ours.tolist() == hf.tolist()


# --- streamers and stopping criteria ---------------------------------------------------------


@pytest.mark.parametrize("key", ["streamer", "lookahead_streamer"])
def test_streamer_gets_prompt_then_tokens_then_end(model, ids, key):
    rec = Recorder()
    out = model.generate(ids, max_new_tokens=25, custom_generate=autolade.hf.lookahead, **{key: rec}, **W2)
    assert rec.calls[0] == ids.tolist()  # the prompt, once, first
    assert rec.new_tokens() == _new(out, ids) == hf_greedy(model, ids, 25)
    assert any(len(c) > 1 for c in rec.calls[1:-1]), "several tokens per put: lookahead accepted drafts"


def test_text_iterator_streamer_text_equals_output(model, tok, ids):
    streamer = TextIteratorStreamer(tok, skip_prompt=True)
    result = {}
    worker = threading.Thread(target=lambda: result.update(
        out=model.generate(ids, max_new_tokens=25, custom_generate=autolade.hf.lookahead, streamer=streamer, **W2)))  # fmt: skip
    worker.start()
    text = "".join(streamer)
    worker.join()
    assert text == tok.decode(_new(result["out"], ids))


def _stop_case(model, tok, ids):
    """A stop string that greedy output completes in its middle, and HF's output with it."""
    ref = tok.decode(hf_greedy(model, ids, 30))
    stop = ref[10:12]
    hf = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=False,
                        stop_strings=[stop], tokenizer=tok)  # fmt: skip
    assert hf.shape[1] - ids.shape[1] <= 12 and tok.decode(_new(hf, ids)).endswith(stop)
    return stop, hf


def test_stop_strings_three_ways(model, tok, ids):
    stop, hf = _stop_case(model, tok, ids)
    rec = Recorder()
    by_key = model.generate(ids, max_new_tokens=30, custom_generate=autolade.hf.lookahead, stop_strings=stop,
                            lookahead_tokenizer=tok, streamer=rec, **W2)  # fmt: skip
    assert by_key.tolist() == hf.tolist()
    assert rec.new_tokens() == _new(hf, ids)  # nothing past the stop reached the streamer
    criteria = StoppingCriteriaList([StopStringCriteria(tok, [stop])])
    by_criteria = model.generate(ids, max_new_tokens=30, custom_generate=autolade.hf.lookahead, stopping_criteria=criteria, **W2)
    assert by_criteria.tolist() == hf.tolist()
    by_folder = autolade.hf.generate(model, ids, max_new_tokens=30, stop_strings=[stop], tokenizer=tok, **W2)
    assert by_folder.tolist() == hf.tolist()
    with pytest.raises(ConfigError, match="lookahead_tokenizer"):
        model.generate(ids, max_new_tokens=30, custom_generate=autolade.hf.lookahead, stop_strings=stop, **W2)


class AtToken(StoppingCriteria):
    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.n, dtype=torch.bool)


def test_tracker_cuts_inside_a_multi_token_commit(ids):
    rec = Recorder()
    tracker = _Tracker(ids, 20, StoppingCriteriaList([AtToken(ids.shape[1] + 3)]), rec)
    tracker.on_tokens([7])
    assert not tracker.stop([7])
    tracker.on_tokens([8, 9, 10, 11])  # the criterion fires at the 3rd new token
    assert tracker.stop([]) and tracker.cut and tracker.kept == 3
    tracker.on_tokens([12])
    assert rec.calls == [[7], [8, 9]]


def test_custom_criterion_stops_where_sample_would(model, ids):
    n = ids.shape[1] + 9
    hf = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=False,
                        stopping_criteria=StoppingCriteriaList([AtToken(n)]))  # fmt: skip
    ours = model.generate(ids, max_new_tokens=30, custom_generate=autolade.hf.lookahead,
                          stopping_criteria=StoppingCriteriaList([AtToken(n)]), **W2)  # fmt: skip
    assert ours.tolist() == hf.tolist() and ours.shape[1] == n


# --- the folder form and pipelines -----------------------------------------------------------


def test_folder_form_with_trust_remote_code(model, ids):
    rec = Recorder()
    out = model.generate(ids, max_new_tokens=20, custom_generate=autolade.hf.folder(), trust_remote_code=True, streamer=rec, **W2)
    assert _new(out, ids) == hf_greedy(model, ids, 20) == rec.new_tokens()
    assert rec.calls[0] == ids.tolist()


def test_pipeline_with_chat_messages(model, tok):
    pipe = pipeline("text-generation", model=model, tokenizer=tok)
    messages = [{"role": "user", "content": "Say 123 and abc."}]
    ref = pipe(messages, max_new_tokens=20, do_sample=False)
    ours = pipe(messages, max_new_tokens=20, do_sample=False, custom_generate=autolade.hf.lookahead, **W2)
    assert ours[0]["generated_text"] == ref[0]["generated_text"]
    assert ours[0]["generated_text"][-1]["role"] == "assistant"


# --- sampling --------------------------------------------------------------------------------

WARPED = dict(temperature=1.1, top_k=20, top_p=0.95, min_p=0.02, repetition_penalty=1.2)
SAMPLES = 1000


def test_sampling_with_seed_equals_autolade_generate(ids):
    m = peaky("llama")
    ids = ids % 63 + 1  # the peaky model's vocab is 64 and its pad token 0 (generate would mask it as padding)
    for seed in range(3):
        ours = m.generate(ids, max_new_tokens=16, custom_generate=autolade.hf.lookahead, do_sample=True, seed=seed, **WARPED, **W2)
        direct = autolade.generate(m, ids, max_new_tokens=16, do_sample=True, seed=seed, **WARPED, **W2)
        assert ours.tolist() == direct.sequences.tolist()


def test_sampling_keeps_the_distribution():
    """Chi-square of the first K tokens over SAMPLES seeds against the exact warped joint
    distribution (test_sampling's method), with transformers building the warpers."""
    m = peaky("llama")
    start = torch.tensor([[5, 17, 33, 9, 40, 2, 61, 12]])
    torch.manual_seed(3)
    prompt = m.generate(start, attention_mask=torch.ones_like(start), do_sample=True, top_k=0, max_new_tokens=100)
    warps = dict(WARPED)
    mask = torch.ones_like(prompt)  # the prompt holds the pad token 0: without a mask generate would treat it as padding
    samples = []
    for seed in range(SAMPLES):
        out = m.generate(prompt, attention_mask=mask, max_new_tokens=K, custom_generate=autolade.hf.lookahead, do_sample=True, seed=seed, **warps,
                         config=LookaheadConfig(window=4, ngram=4, guesses=4))  # fmt: skip
        samples.append(tuple(_new(out, prompt)))
    p, df = chi_square_p(samples, exact_joint(m, prompt, K, tau=1.0 / SAMPLES, warps=warps))
    assert p > ALPHA, f"drop-in sampling deviates from the warped distribution (p={p:.2e}, df={df})"
    # the same samples reject a distribution with one warper left out: the test sees a misread processor
    loose = dict(warps, top_k=0, min_p=None)
    p_loose, _ = chi_square_p(samples, exact_joint(m, prompt, K, tau=1.0 / SAMPLES, warps=loose))
    assert p_loose < ALPHA


# --- what it cannot honour -------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_beams=2), "num_beams"),
        (dict(num_return_sequences=2, do_sample=True), "num_return_sequences"),
        (dict(output_scores=True, return_dict_in_generate=True), "output_scores"),
        (dict(no_repeat_ngram_size=2), "NoRepeatNGramLogitsProcessor"),
        (dict(min_new_tokens=5, eos_token_id=3), "MinLengthLogitsProcessor"),  # generate turns min_new_tokens into a min length
        (dict(seed=1), "seed only applies when sampling"),
        (dict(prompt_lookup_num_tokens=5), "prompt_lookup_num_tokens"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_unsupported_arguments_raise(model, ids, kwargs, match):
    with pytest.raises(AutoladeError, match=match):
        model.generate(ids, max_new_tokens=5, custom_generate=autolade.hf.lookahead, **kwargs)


def test_a_refused_call_still_ends_the_streamer(model, ids):
    """generate put() the prompt before lookahead refuses: end() follows, so a reader never waits forever."""
    rec = Recorder()
    with pytest.raises(ConfigError, match="NoRepeatNGramLogitsProcessor"):
        model.generate(ids, max_new_tokens=5, custom_generate=autolade.hf.lookahead, no_repeat_ngram_size=2, streamer=rec)
    assert rec.calls == [ids.tolist(), "end"]


def test_a_batch_refuses_what_stops_one_row_at_a_time(model, tok, ids):
    batch = torch.cat([ids, ids])
    with pytest.raises(ConfigError, match="a streamer takes one sequence"):
        model.generate(batch, max_new_tokens=5, custom_generate=autolade.hf.lookahead, streamer=Recorder())
    with pytest.raises(ConfigError, match="drop StopStringCriteria"):
        model.generate(batch, max_new_tokens=5, custom_generate=autolade.hf.lookahead, stop_strings=["x"],
                       lookahead_tokenizer=tok)
    mask = torch.ones_like(batch)
    mask[0, -1] = 0
    with pytest.raises(InputError, match="pad on the left"):
        model.generate(batch, attention_mask=mask, max_new_tokens=5, custom_generate=autolade.hf.lookahead)
    with pytest.raises(ConfigError, match="model.generate"):
        autolade.hf.lookahead(model, ids)


def test_one_left_padded_row_equals_generate(model, ids):
    padded = torch.cat([torch.zeros((1, 3), dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros((1, 3), dtype=torch.long), torch.ones_like(ids)], dim=1)
    ours = model.generate(padded, attention_mask=mask, max_new_tokens=6, custom_generate=autolade.hf.lookahead, pad_token_id=0)
    assert torch.equal(ours, model.generate(padded, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0))


# --- real models (slow) ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_real_model_greedy_stream_eos_and_stop(name, request):
    """fp32, 48 tokens of a HumanEval prompt: the drop-in's tokens are model.generate's (resolved
    settings with a streamer, whose text is the output's; explicit W/N/G with an EOS in the middle),
    and a stop string from the middle of the output cuts where model.generate cuts."""
    model, tok = request.getfixturevalue(name)
    prompt = load_workload("code", limit=1)[0]
    inputs = {"input_ids": encode_prompt(tok, prompt.text, kind="code")}
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    n = inputs["input_ids"].shape[1]
    hf = model.generate(**inputs, max_new_tokens=48, do_sample=False)
    streamer = TextIteratorStreamer(tok, skip_prompt=True)
    result = {}
    worker = threading.Thread(target=lambda: result.update(
        out=model.generate(**inputs, max_new_tokens=48, custom_generate=autolade.hf.lookahead, streamer=streamer)))  # fmt: skip
    worker.start()
    text = "".join(streamer)
    worker.join()
    assert result["out"].tolist() == hf.tolist()
    assert text == tok.decode(hf[0, n:])

    eos = int(hf[0, n + 24])  # a token of the output's middle ends the generation there (or earlier)
    hf_eos = model.generate(**inputs, max_new_tokens=48, do_sample=False, eos_token_id=[eos])
    ours_eos = model.generate(**inputs, max_new_tokens=48, custom_generate=autolade.hf.lookahead, eos_token_id=[eos], **W2)
    assert ours_eos.tolist() == hf_eos.tolist() and hf_eos.shape[1] <= n + 25 and int(hf_eos[0, -1]) == eos

    full = tok.decode(hf[0, n:])
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    hf_stop = model.generate(**inputs, max_new_tokens=48, do_sample=False, stop_strings=[stop], tokenizer=tok)
    ours_stop = autolade.hf.generate(model, **inputs, max_new_tokens=48, stop_strings=[stop], tokenizer=tok)
    assert ours_stop.tolist() == hf_stop.tolist() and hf_stop.shape[1] < hf.shape[1]
