"""`data.chat_template`: a Jinja chat template (the text, or a file holding it) for a model whose
tokenizer has none, or to replace the one it has.

Why a key: base models usually ship no template, and chat rows need one to become text; without
the key a user had to edit the model folder. TRL (`chat_template_path`) and Axolotl
(`chat_template_jinja`) take the template the same way. The template is set on the tokenizer the
trial loads, so training, the data preview and lm-eval (`eval.apply_chat_template`) all render
with it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

TEMPLATE_SUFFIXES = (".jinja", ".jinja2", ".j2", ".txt")


def chat_template_text(value: str | None) -> str | None:
    """The template itself: the file's content when `value` names a file, else `value`."""
    if not value:
        return None
    path = Path(value).expanduser()
    if "{" not in value and (path.suffix in TEMPLATE_SUFFIXES or path.is_file()):
        return path.read_text(encoding="utf-8")
    return value


def chat_template_problems(value: str | None) -> list[str]:
    """A missing template file, or a template Jinja cannot compile, as one line each."""
    if not value:
        return []
    if "{" not in value and not Path(value).expanduser().is_file():
        return [f"data.chat_template: {value} is neither a Jinja template (it has no '{{') nor an existing file "
                "(fix: the path of a .jinja file, or the template text itself)"]
    try:
        text = chat_template_text(value) or ""
    except (OSError, UnicodeDecodeError) as exc:
        return [f"data.chat_template: cannot read {value} ({exc}) (fix: a readable UTF-8 .jinja file)"]
    from jinja2.exceptions import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # what transformers renders chat templates with

    try:
        ImmutableSandboxedEnvironment().parse(text)
    except TemplateSyntaxError as exc:
        return [f"data.chat_template: not a valid Jinja template ({exc.message}, line {exc.lineno}) "
                "(fix: correct the template, e.g. start from a model's tokenizer_config.json chat_template)"]
    return []


def apply_chat_template_override(tokenizer: Any, data_cfg: dict[str, Any]) -> Any:
    """`tokenizer` with `data.chat_template` set (unchanged when the key is null)."""
    text = chat_template_text(data_cfg.get("chat_template"))
    if text:
        tokenizer.chat_template = text
    return tokenizer


def training_tokenizer(model_cfg: dict[str, Any], data_cfg: dict[str, Any], embedded_model_dir: Path) -> Any:
    """The tokenizer a trial trains with (the model's, with `data.chat_template`), without the
    model: what the data checks and the preview measure with."""
    from transformers import AutoTokenizer

    from workloads.model.loading import resolve_model_path

    path = resolve_model_path(model_cfg["name_or_path"], embedded_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=bool(model_cfg.get("trust_remote_code")))
    return apply_chat_template_override(tokenizer, data_cfg)
