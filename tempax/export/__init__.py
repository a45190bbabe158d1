"""A model or a finished run for other tools and for people: the exported Hugging Face folder or GGUF file
(`exporter`), the model card read from what the run left in its directory (`model_card`), and the facts of a
model read without loading its weights (`model_info`).

It reads the algorithms' records (the card names the algorithm and its knobs) and the training layer's run dirs,
so it sits above `algorithms`, beside `experiments`, under `cli`. Nothing heavy is imported here.
"""
