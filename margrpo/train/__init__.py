"""margrpo.train: the jobs that change weights.

    margrpo.train.pretrain   MAR pretraining of the tiny ShapesWorld model (`margrpo pretrain`)
    margrpo.train.trainer    GRPO / MAR-GRPO post-training (`margrpo train`)

Submodules are imported on use, so `import margrpo.train` stays cheap.
"""
