"""hf_dspark: exact DSpark speculative decoding for Hugging Face transformers.

    import hf_dspark
    drafter = hf_dspark.DSparkDrafter.from_pretrained("model_cards/dspark-smollm2-135m-instruct", target=model)
    out = model.generate(**enc, assistant_model=drafter)                        # routed to the DSpark loop
    out = model.generate(**enc, custom_generate=hf_dspark.generate, drafter=drafter)  # patch-free

Importing hf_dspark wraps `GenerationMixin.generate` once so that `assistant_model=<DSparkDrafter>` reaches the
DSpark loop; calls without a DSpark drafter are passed through untouched (see `install_assistant_route`).
"""

from .configuration import DSparkConfig
from .generation import DSparkGenerateOutput, DSparkStats, generate, install_assistant_route
from .modeling import DSparkDrafter

__version__ = "0.1.0"

install_assistant_route()

__all__ = [
    "DSparkConfig",
    "DSparkDrafter",
    "DSparkGenerateOutput",
    "DSparkStats",
    "generate",
    "install_assistant_route",
    "__version__",
]
