"""Tokenizer: a checkpoint's tokenizer.json (via the tokenizers library) and its Jinja chat template."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.sandbox
from tokenizers import Tokenizer as HFTokenizer


class TokenizerError(ValueError):
    """A checkpoint's tokenizer files are missing or unusable."""


class Tokenizer:
    def __init__(
        self,
        backend: HFTokenizer,
        special_tokens: dict[str, str | None],
        chat_template: str | None,
        extra_eos_token_ids: list[int] = (),
    ):
        self.backend = backend
        self.special_tokens = special_tokens  # bos_token, eos_token, unk_token, pad_token -> text or None
        self.chat_template = chat_template
        self.bos_token_id = self.token_to_id(special_tokens.get("bos_token"))
        eos = [self.token_to_id(special_tokens.get("eos_token")), *extra_eos_token_ids]
        self.eos_token_ids = list(dict.fromkeys(i for i in eos if i is not None))
        self._template = _compile(chat_template) if chat_template else None

    @classmethod
    def from_dir(cls, model_dir: str | Path, extra_eos_token_ids: list[int] = ()) -> Tokenizer:
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{model_dir} has no tokenizer.json")
        backend = HFTokenizer.from_file(str(path))
        config_path = model_dir / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        special = {key: _token_text(config.get(key)) for key in ("bos_token", "eos_token", "unk_token", "pad_token")}
        return cls(backend, special, _chat_template(model_dir, config), extra_eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """The prompt text for a conversation, rendered as transformers' apply_chat_template(tokenize=False) does.

        Raises TokenizerError when the model has no template or the template rejects the messages."""
        if self._template is None:
            raise TokenizerError("this model has no chat template")
        context = {key: value for key, value in self.special_tokens.items() if value is not None}
        context.update(kwargs)
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt, **context)
        except jinja2.TemplateError as exc:  # raised by the template itself, e.g. roles out of order
            raise TokenizerError(f"chat template: {exc}") from exc


def _token_text(value) -> str | None:
    # tokenizer_config.json writes special tokens as text or as an AddedToken dict {"content": ...}.
    if isinstance(value, dict):
        return value.get("content")
    return value


def _chat_template(model_dir: Path, config: dict) -> str | None:
    # transformers 5 writes chat_template.jinja beside the tokenizer; older checkpoints keep it in the config,
    # sometimes as a list of named templates.
    jinja_path = model_dir / "chat_template.jinja"
    if jinja_path.is_file():
        return jinja_path.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {entry["name"]: entry["template"] for entry in template}
        template = named.get("default") or next(iter(named.values()), None)
    return template


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _compile(source: str) -> jinja2.Template:
    # Same environment settings as transformers' chat template rendering.
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)
