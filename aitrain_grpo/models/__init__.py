"""Models: every `--model` name (`tiny`, `smollm2`, a `.gguf` file, a folder, a run output, a hub id)
turned into a model and tokenizer.

`loading` resolves names and loads; `tiny` builds the small local model (its corpus in `tiny_corpus`);
`gguf` converts a GGUF file into a cached Hugging Face folder.

Left out: anything about environments, episodes or training.
"""
