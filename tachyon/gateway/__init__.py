"""`tachyon gateway`: one front door over many OpenAI-compatible backends (API keys, limits, routing, balancing).

A layer of its own: it speaks HTTP to backends and imports nothing of the engine.
"""
