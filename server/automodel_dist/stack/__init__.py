"""stack: AutoModel 0.7.0's own code on this machine, shared by every process that runs it.

- :mod:`.shims`: the small patches a CPU needs (each checked against the installed release), for fake tensors (the
  dry run) and for real ones (the smoke run on AutoModel's stack);
- :mod:`.te_attention`, :mod:`.liger`: stand-ins for CUDA-only kernels AutoModel picks by default;
- :mod:`.step`: AutoModel's model build and training step, in ``recipes/llm/train_ft.py``'s order.

Only worker processes import these modules; torch and AutoModel are imported inside them.
"""
