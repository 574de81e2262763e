"""The Qwen2.5-VL chat format as a Jinja template, shared by every tokenizer that speaks it.

Both the tiny local models and the real-Qwen tokenizer must render a conversation to the *same*
string: the rollout builds prompts with one and a benchmark may run them on the other, and a
policy trained on one layout sees a different distribution under another.

The layout (one turn):

    <|im_start|>{role}\\n{content}<|im_end|>\\n

where an image content part renders as `<|vision_start|><|image_pad|><|vision_end|>` (the
processor later expands the single `<|image_pad|>` into one pad per merged vision patch), a video
part as `<|vision_start|><|video_pad|><|vision_end|>`, and a conversation that does not open with
a system message gets `DEFAULT_SYSTEM_PROMPT`. `add_generation_prompt=True` appends the header of
the assistant turn the model is about to write.
"""

from __future__ import annotations

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"

# Ordered: a tokenizer trained with these as its first special tokens gives them ids 0..6.
QWEN_VL_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# Every piece of output is an explicit string expression and every tag strips whitespace (`-`),
# so the rendering does not depend on the Jinja environment's trim_blocks/lstrip_blocks settings.
# `'image' in part` accepts the HF message styles {"type": "image"}, {"image": ...}, {"image_url": ...}.
QWEN_VL_CHAT_TEMPLATE = (
    r"""{%- set counts = namespace(images=0, videos=0) -%}
{%- for message in messages -%}
    {%- if loop.first and message['role'] != 'system' -%}
        {{- '<|im_start|>system\n"""
    + DEFAULT_SYSTEM_PROMPT
    + r"""<|im_end|>\n' -}}
    {%- endif -%}
    {{- '<|im_start|>' + message['role'] + '\n' -}}
    {%- if message['content'] is string -%}
        {{- message['content'] -}}
    {%- else -%}
        {%- for part in message['content'] -%}
            {%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}
                {%- set counts.images = counts.images + 1 -%}
                {%- if add_vision_id -%}{{- 'Picture ' + counts.images | string + ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
            {%- elif part['type'] == 'video' or 'video' in part -%}
                {%- set counts.videos = counts.videos + 1 -%}
                {%- if add_vision_id -%}{{- 'Video ' + counts.videos | string + ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
            {%- elif 'text' in part -%}
                {{- part['text'] -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}"""
)
