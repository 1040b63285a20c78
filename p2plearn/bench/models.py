"""The tensors a benchmark averages: one flat tensor of a size, or a real model's tensor shapes.

    tensors = model_tensors("gpt2-small")       # 148 tensors, 124.4M float32 parameters
    tensors = model_tensors("flat", megabytes=10)
    shapes = model_shapes("gpt2-small")         # the same without allocating

Both sides of a comparison (p2plearn's rounds, gloo's all_reduce) build their tensors here, so
that they average the same shapes. The tensors hold ones: the benchmarks time communication, and
averaging equal values changes nothing between rounds.
"""
from __future__ import annotations

import math

MODELS = ("flat", "gpt2-small")


def gpt2_small_shapes() -> dict[str, tuple[int, ...]]:
    """GPT-2 small's parameters by name and shape (Hugging Face's layout: 50257 x 768 token embedding,
    1024 x 768 positions, 12 blocks of attention, MLP and two layer norms, a final layer norm; the
    output head is tied to the embedding, so not a tensor of its own)."""
    dim, blocks = 768, 12
    shapes: dict[str, tuple[int, ...]] = {"wte.weight": (50257, dim), "wpe.weight": (1024, dim)}
    for b in range(blocks):
        for name, shape in (("ln_1.weight", (dim,)), ("ln_1.bias", (dim,)),
                            ("attn.c_attn.weight", (dim, 3 * dim)), ("attn.c_attn.bias", (3 * dim,)),
                            ("attn.c_proj.weight", (dim, dim)), ("attn.c_proj.bias", (dim,)),
                            ("ln_2.weight", (dim,)), ("ln_2.bias", (dim,)),
                            ("mlp.c_fc.weight", (dim, 4 * dim)), ("mlp.c_fc.bias", (4 * dim,)),
                            ("mlp.c_proj.weight", (4 * dim, dim)), ("mlp.c_proj.bias", (dim,))):
            shapes[f"h.{b}.{name}"] = shape
    shapes["ln_f.weight"], shapes["ln_f.bias"] = (dim,), (dim,)
    return shapes


def model_shapes(model: str, megabytes: float = 10.0) -> dict[str, tuple[int, ...]]:
    """The model's tensor shapes by name: "flat" is one tensor of `megabytes` MiB of float32,
    "gpt2-small" GPT-2 small's (`megabytes` ignored)."""
    if model == "flat":
        return {"w": (int(megabytes * 2**20 / 4),)}
    if model == "gpt2-small":
        return gpt2_small_shapes()
    raise ValueError(f"unknown model {model!r}: one of {', '.join(MODELS)}")


def model_tensors(model: str, megabytes: float = 10.0) -> dict[str, "torch.Tensor"]:  # noqa: F821
    """The model's named float32 tensors, of ones."""
    import torch

    return {name: torch.ones(shape) for name, shape in model_shapes(model, megabytes).items()}


def model_bytes(model: str, megabytes: float = 10.0) -> int:
    """The float32 size of the model's tensors in bytes."""
    return 4 * sum(math.prod(shape) for shape in model_shapes(model, megabytes).values())
