"""The built-in model's corpus (the Zen of Python, which ships with Python) and its byte-level BPE tokenizer."""

from __future__ import annotations

import codecs
import contextlib
import io

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS, EOS, END = "<|bos|>", "<|eos|>", "<|end|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (BOS, EOS, END, *ROLE_TOKENS)
# HF-compatible chat template: one "<|role|>\ncontent<|end|>\n" block per message.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
CHAT_PROMPTS = ("Complete: {}", "Continue: {}", "Finish the line: {}")


def zen_text() -> str:
    """The Zen of Python as `import this` prints it, read without printing it."""
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    return codecs.decode(this.s, "rot13")


def zen_lines() -> list[str]:
    return [line for line in zen_text().splitlines() if line.strip()]


def render_chat(messages: list[dict], add_generation_prompt: bool) -> str:
    """Same text as CHAT_TEMPLATE renders (used to build training examples without Jinja)."""
    text = BOS + "".join(f"<|{m['role']}|>\n{m['content']}{END}\n" for m in messages)
    return text + ("<|assistant|>\n" if add_generation_prompt else "")


def train_tokenizer(text: str, vocab_size: int) -> Tokenizer:
    """Byte-level BPE (GPT-2 style) trained on `text`; encode() with special tokens prepends BOS."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([text], trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def tokenizer_config(model_max_length: int) -> dict:
    """tokenizer_config.json for transformers' AutoTokenizer and for our Tokenizer."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": END,
        "pad_token": EOS,
        "unk_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
