"""The sentence-transformers modules that may follow pooling, as read from their config: Dense (a linear layer and
its activation, weights in its folder) and Normalize. Specs only, no torch: pipeline.py reads them, colbert.py
keeps a MultiVectorEncoder's, sentence_head.py builds the layers."""

from __future__ import annotations

from dataclasses import dataclass

# Dense's activation_function: torch.nn classes built without arguments (sentence-transformers imports the
# class a "torch." path names and calls it), that the ONNX export writes as one standard op each.
DENSE_ACTIVATIONS = ("Identity", "Tanh", "ReLU", "GELU", "Sigmoid", "SiLU", "LeakyReLU", "ELU")
DENSE_DEFAULT_ACTIVATION = "Tanh"  # sentence-transformers' default when the config names none
DENSE_KEYS = {"in_features", "out_features", "bias", "activation_function", "module_input_name",
              "module_output_name", "use_residual"}
DENSE_WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class Dense:
    """A Dense module: linear (+ residual) then activation, over the sentence embedding."""

    folder: str  # relative to the checkpoint; its DENSE_WEIGHTS hold linear.weight/.bias (and residual.weight)
    in_features: int
    out_features: int
    bias: bool
    activation: str  # one of DENSE_ACTIVATIONS
    use_residual: bool  # add the input (projected without bias when the sizes differ) after the activation
    # Where the weights are the checkpoint's own (folder ""): the keys of linear.weight and linear.bias in its
    # model weights (CLIP's text_projection). Empty: the folder's DENSE_WEIGHTS.
    checkpoint_keys: tuple[str, ...] = ()

    def describe(self) -> str:
        return (f"Dense({self.in_features}->{self.out_features}, {self.activation.lower()}"
                f"{'' if self.bias else ', no bias'}{', residual' if self.use_residual else ''})")


@dataclass(frozen=True)
class Normalize:
    """L2 normalisation of the sentence embedding."""

    def describe(self) -> str:
        return "Normalize"
