"""FusedOp: both routes of a public op to its kernels (see _kernels.py), built from one definition.

An op is defined once by its schema, its kernels, `forward(kernels, backend, *inputs)` (the kernel
calls, plus value checks that need the data; None when it is the first kernel on the inputs, which the
eager route then calls without a frame of its own), `fake(*inputs)` (output metadata) and, when it has a
gradient, a `Gradient` (what to save and the backward formula). From that the factory builds

  - the torch.library custom op `margrpo::<name>` (with its fake, and its autograd registered),
    taken under torch.compile, dispatch modes and torch.func transforms;
  - the torch.autograd.Function of the eager route, which calls the kernels directly;
  - for a gradient with a backward kernel, the custom op `margrpo::<name>_backward` and its fake, so
    the backward too runs under torch.compile and double backward records it.

`FusedOp.run(device, inputs)` picks the route and the backend. The public ops validate their
arguments, bring them to the kernel layout and call it; nothing below them validates again.

A forward-only op (`forward_only=True`, the adaLN ops) has no backward kernels: its oracle is plain
PyTorch that autograd and torch.compile see through, so with grad mode on, and wherever the chosen
backend is torch, it runs inline on every route; only its other backends go through the custom op.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import _backend, _kernels, oracle


def _first_kernel(kernels: tuple[Callable, ...], backend: str, *inputs):
    return kernels[0](*inputs)


@dataclass(frozen=True)
class Gradient:
    """How an op differentiates.

    save(inputs, outputs) -> (tensors, attrs): what backward needs (tensors are saved for backward).
    backward(run, tensors, attrs, *grad_outputs) -> one gradient (or None) per input; `run(*args)`
        calls the backward kernel (directly in eager mode, through `margrpo::<name>_backward`
        otherwise).
    kernel, schema, fake: the backward kernel's name, its custom op's schema (with a trailing
        `str backend`) and fake; None when backward needs no kernel of its own.
    non_differentiable: indices of outputs that carry no gradient.
    """

    save: Callable
    backward: Callable
    kernel: str | None = None
    schema: str | None = None
    fake: Callable | None = None
    non_differentiable: tuple[int, ...] = ()


class FusedOp:
    """One public op's routes to the kernels of `kernels` (forward kernels first, then the backward
    kernel if any) in kernels/<module>.py, margrpo.ops.oracle and torch.ops.margrpo.

    backends: those the op has kernels for (a selection outside them takes `auto`'s choice among
    them); forward_only: see the module docstring; custom_forward: the custom op's body when it must
    differ from `forward` (a forward that may write into an input, which a custom op must not)."""

    def __init__(
        self,
        name: str,
        module: str,
        kernels: tuple[str, ...],
        schema: str,
        forward: Callable | None,
        fake: Callable,
        gradient: Gradient | None = None,
        backends: tuple[str, ...] = _backend.BACKENDS,
        forward_only: bool = False,
        custom_forward: Callable | None = None,
    ):
        self.name, self.module, self.kernels, self.gradient = name, module, kernels, gradient
        self.plain = forward is None  # run calls kernels[0](*inputs) itself
        self.forward = _first_kernel if forward is None else forward
        self.backends, self.forward_only = backends, forward_only
        body = self.forward if custom_forward is None else custom_forward
        # the positions of the schema's tensor arguments: the eager route asks only them whether
        # autograd must record the call
        arguments = schema.split("->")[0].strip(" ()").split(", ")
        self._tensor_inputs = tuple(i for i, a in enumerate(arguments) if a.startswith("Tensor"))

        def op_body(*args):
            backend = args[-1]
            return body(self._kernels_of(backend), backend, *args[:-1])

        self.custom_op = torch.library.custom_op(f"margrpo::{name}", op_body, mutates_args=(), schema=schema)
        self.custom_op.register_fake(lambda *args: fake(*args[:-1]))
        self.backward_op = None
        if gradient is None:
            return
        if gradient.kernel is not None:

            def backward_body(*args):
                backend, tensors = args[-1], [a.contiguous() if isinstance(a, torch.Tensor) else a for a in args[:-1]]
                return _kernels.get(backend, module, gradient.kernel)(*tensors)

            self.backward_op = torch.library.custom_op(f"margrpo::{name}_backward", backward_body, mutates_args=(), schema=gradient.schema)
            self.backward_op.register_fake(lambda *args: gradient.fake(*args[:-1]))
        self.custom_op.register_autograd(self._custom_op_backward, setup_context=self._custom_op_setup)
        self.function = self._eager_function()

    def _kernels_of(self, backend: str) -> tuple[Callable, ...]:
        return tuple(_kernels.get(backend, self.module, name) for name in self.kernels)

    def run(self, device: torch.device, inputs: tuple, empty: bool = False, backend: str | None = None):
        """The op on `inputs` (already in the kernel layout). empty: no work to do (the oracle then
        returns the empty result without any kernel launch). backend: this call's selection (the
        choices of set_backend), None for the global one. (A method taking a tuple, not __call__
        with *inputs: an instance call with keywords repacks its arguments, about 0.4 us a call.)"""
        # the main input's size picks the backend table's size bucket
        elements = 0 if empty else inputs[0].numel()
        if self.forward_only and torch.is_grad_enabled():
            empty = True  # the oracle, inline: autograd records its PyTorch ops
        if _kernels.direct_call_allowed():
            backend, kernels = _kernels.for_eager(device, self.name, self.module, self.kernels, empty, elements, backend, self.backends)
            if self.gradient is not None and torch.is_grad_enabled() and any(inputs[i].requires_grad for i in self._tensor_inputs):
                return self.function.apply(backend, kernels, *inputs)
            return kernels[0](*inputs) if self.plain else self.forward(kernels, backend, *inputs)
        if empty:
            backend = "torch"
        else:
            backend = _kernels.pick(
                device, self.name, self.module, *self.kernels, elements=elements, selection=backend, implemented=self.backends
            )
        if self.forward_only and backend == "torch":
            # inline, so torch.compile traces the oracle's ops (getattr: no cached lookup to trace)
            return self.forward(tuple(getattr(oracle, name) for name in self.kernels), "torch", *inputs)
        return self.custom_op(*inputs, backend)

    # ------------------------------------------------------------------ autograd, both routes
    def _save(self, ctx, inputs, outputs, backend: str) -> None:
        gradient = self.gradient
        if gradient.non_differentiable:
            ctx.mark_non_differentiable(*(outputs[i] for i in gradient.non_differentiable))
        tensors, ctx.attrs = gradient.save(inputs, outputs)
        ctx.save_for_backward(*tensors)
        ctx.backend = backend

    def _custom_op_setup(self, ctx, inputs, output) -> None:
        self._save(ctx, inputs[:-1], output, inputs[-1])

    def _custom_op_backward(self, ctx, *grads):
        def run(*args):
            return self.backward_op(*args, ctx.backend)

        return (*self.gradient.backward(run, ctx.saved_tensors, ctx.attrs, *grads), None)  # None: backend

    def _eager_function(self) -> type[torch.autograd.Function]:
        op = self

        class Eager(torch.autograd.Function):
            """The eager route's autograd: the kernels called directly, without the custom op's dispatch."""

            @staticmethod
            def forward(ctx, backend, kernels, *inputs):
                outputs = op.forward(kernels, backend, *inputs)
                op._save(ctx, inputs, outputs, backend)
                ctx.backward_kernel = kernels[-1]
                return outputs

            @staticmethod
            def backward(ctx, *grads):
                def run(*args):
                    if torch.is_grad_enabled():
                        # create_graph=True: the backward custom op records that it has no derivative
                        return op.backward_op(*args, ctx.backend)
                    return ctx.backward_kernel(*(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args))

                return (None, None, *op.gradient.backward(run, ctx.saved_tensors, ctx.attrs, *grads))

        Eager.__name__ = Eager.__qualname__ = f"{self.name}_eager"
        return Eager
