"""custom_generate entry point shipped inside every DSpark drafter folder / Hub repo.

    model.generate(**enc, custom_generate="<drafter folder or repo>", trust_remote_code=True, drafter=drafter)

transformers calls `generate(model=..., **all_generate_arguments)`; we hand them to `model.generate` with the
DSpark loop as the custom_generate callable. The code lives in the `hf-dspark` package (requirements.txt).
"""

import hf_dspark


def generate(model, **kwargs):
    drafter = kwargs.pop("drafter", None) or kwargs.pop("assistant_model", None)
    if drafter is None:
        raise ValueError("Pass drafter=DSparkDrafter.from_pretrained(<this repo>, target=model) to generate().")
    kwargs.pop("assistant_model", None)
    kwargs["dspark_streamer"] = kwargs.pop("streamer", None)
    kwargs["stop_tokenizer"] = kwargs.pop("tokenizer", None)
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    return model.generate(custom_generate=hf_dspark.generate, drafter=drafter, **kwargs)
