"""Models: a pretrained encoder read from safetensors (:mod:`.pretrained`), a grouped-query-attention decoder
read from a GGUF file (:mod:`.llama`) and the training of attention regressors and head subspaces
(:mod:`.training`). Used qualified.
"""
