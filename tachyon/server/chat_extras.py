"""What the chat endpoint takes beyond plain text messages, as vLLM serves it: OpenAI content-part lists (text
parts joined; an image or audio part is a clear 400, this model takes text only), the text `echo` repeats, and the
per-request template arguments."""

from __future__ import annotations

from tachyon.server.errors import APIError

_MEDIA_PARTS = ("image_url", "input_image", "image", "image_pil", "image_embeds", "input_audio", "audio_url",
                "audio", "video_url", "video", "file", "input_file")


def message_text(content, index: int) -> str:
    """A message's content as one string: a string as is, a list of parts as its text parts joined."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        where = f"messages.{index}.content.{j}"
        if part.type in ("text", "input_text", "output_text", "refusal"):
            if part.text is None:
                raise APIError(400, f"{where}: a {part.type!r} part needs 'text'", where)
            texts.append(part.text)
        elif part.type in _MEDIA_PARTS:
            raise APIError(400, f"{where}: a content part of type {part.type!r}: this model takes text only",
                           where)
        else:
            raise APIError(400, f"{where}: unknown content part type {part.type!r} (text parts only)", where)
    return "".join(texts)


def echo_prefix(messages: list[dict], response_role: str) -> str:
    """`echo: true`: the last message's content if it has the role the response will have, else nothing."""
    if messages and messages[-1]["role"] == response_role:
        return messages[-1]["content"]
    return ""


def check_template_flags(add_generation_prompt: bool, continue_final_message: bool, messages: list[dict]) -> None:
    if continue_final_message and add_generation_prompt:
        raise APIError(400, "continue_final_message and add_generation_prompt cannot both be true: set "
                            "add_generation_prompt to false to continue the last message", "continue_final_message")
    if continue_final_message and (not messages or messages[-1]["role"] != "assistant"):
        raise APIError(400, "continue_final_message needs the last message to be an assistant message",
                       "continue_final_message")
