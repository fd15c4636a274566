"""Models: a pretrained encoder read from safetensors (:mod:`.pretrained`) and the training of
attention regressors and head subspaces (:mod:`.training`). Used qualified.
"""
