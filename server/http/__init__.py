"""The HTTP door: OpenAI's embeddings API, text-embeddings-inference's routes and /v1/attention, over the core.

door.py serves them; openai.py, tei.py and attention.py translate each family's JSON to the core's requests and
its replies back; bodies.py and each door's *_bodies.py hold the JSON shapes, errors.py the one error -> status
mapping.
"""
