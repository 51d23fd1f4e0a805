"""Everything the run reads before it starts: model names, tokenizers, chat templates, datasets.

dataset.py           datasets -> tokenized prompts with verifier labels, and the report of what was kept
rows.py              one row's rules: validation, chat template, length filter
sources.py           reading hub, local and embedded sources
cache.py             the tokenized-dataset cache
models.py            model and tokenizer names, offline checks, loading
chat_templates.py    open-instruct's chat templates by name
embedded_default.py  the tiny model and verifiable dataset built offline, deterministically
hub.py               hub access, or a clear error when there is none
"""
