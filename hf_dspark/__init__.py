"""hf_dspark: exact DSpark speculative decoding for Hugging Face transformers.

    import hf_dspark
    drafter = hf_dspark.DSparkDrafter.from_pretrained("model_cards/dspark-smollm2-135m-instruct", target=model)
    out = model.generate(**enc, assistant_model=drafter)                                  # our batched loop
    out = model.generate(**enc, assistant_model=drafter, dspark_engine="transformers")    # transformers' loop, batch 1
    out = model.generate(**enc, custom_generate=hf_dspark.generate, drafter=drafter)      # our loop, explicitly

Importing hf_dspark changes nothing in transformers. Binding a drafter to a model (`from_pretrained(..., target=model)`
or `drafter.bind(model)`) routes `assistant_model=<DSparkDrafter>` to DSpark on that model instance only
(`hf_dspark.routing`); `DSparkCandidateGenerator` is the piece transformers' own assisted loop drives.
"""

from .candidate_generator import DSparkCandidateGenerator
from .configuration import DSparkConfig
from .generation import DSparkGenerateOutput, DSparkStats, generate
from .modeling import DSparkDrafter
from .prepack import prepack_linears, unpack_linears

__version__ = "0.1.0"

__all__ = [
    "DSparkCandidateGenerator",
    "DSparkConfig",
    "DSparkDrafter",
    "DSparkGenerateOutput",
    "DSparkStats",
    "generate",
    "prepack_linears",
    "unpack_linears",
    "__version__",
]
