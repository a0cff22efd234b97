# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`ModelConfig`: which model a training script loads, and how (dtype, attention, LoRA adapter, bitsandbytes
quantization). Same fields, defaults and checks as TRL 1.16's `trl.ModelConfig`."""

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    """
    The model side of a training script. [`TrlParser`] (an `HfArgumentParser`) turns every field into a
    command-line flag (`--lora_r 8`) or a key of the `--config` YAML file.

    [`get_peft_config`] builds the LoRA adapter from the `lora_*` fields, [`get_quantization_config`] the
    `BitsAndBytesConfig` from the `load_in_*` / `bnb_*` fields; `trust_remote_code` is a field of [`GRPOConfig`],
    not of this class, as in TRL.

    Parameters:
        model_name_or_path (`str`, *optional*):
            The model to train: a local folder written by `save_pretrained`, or a Hub id.
        model_revision (`str`, *optional*, defaults to `"main"`):
            Branch, tag or commit of a Hub model to load.
        dtype (`str`, *optional*, defaults to `"float32"`):
            The dtype the weights are loaded in: `"float32"`, `"bfloat16"`, `"float16"`, or `"auto"` (the dtype
            the checkpoint was saved in). With 4-bit loading it is also the compute dtype of the quantized layers.
        attn_implementation (`str`, *optional*):
            The attention kernel, e.g. `"eager"`, `"sdpa"` or `"flash_attention_2"` (the last needs the
            `flash-attn` package). `None` lets transformers choose.
        use_peft (`bool`, *optional*, defaults to `False`):
            Train a LoRA adapter instead of every weight.
        lora_r (`int`, *optional*, defaults to `16`):
            Rank of the LoRA update matrices.
        lora_alpha (`int`, *optional*, defaults to `32`):
            LoRA scaling numerator: the update is scaled by `lora_alpha / lora_r` (`lora_alpha / √lora_r` with
            `use_rslora`).
        lora_dropout (`float`, *optional*, defaults to `0.05`):
            Dropout applied to the input of the LoRA matrices.
        lora_target_modules (`str` or `list[str]`, *optional*):
            Names of the modules that get an adapter. A single name (such as `"all-linear"`) is kept as a string,
            which PEFT reads as a regular expression or keyword; `None` uses PEFT's default for the architecture.
        lora_target_parameters (`list[str]`, *optional*):
            Names of parameters (not modules) that get an adapter, e.g. the expert weights of a mixture-of-experts
            layer. Needs PEFT 0.17 or newer.
        lora_modules_to_save (`list[str]`, *optional*):
            Modules trained in full and saved with the adapter (e.g. `"lm_head"`).
        lora_task_type (`str`, *optional*, defaults to `"CAUSAL_LM"`):
            PEFT task type of the adapter; `"SEQ_CLS"` for a reward (sequence classification) model.
        use_rslora (`bool`, *optional*, defaults to `False`):
            Rank-stabilised LoRA: scale the update by `lora_alpha / √lora_r` rather than `lora_alpha / lora_r`.
        use_dora (`bool`, *optional*, defaults to `False`):
            Weight-decomposed LoRA (DoRA, https://huggingface.co/papers/2402.09353): the update is split into a
            learned magnitude and a LoRA-trained direction. PEFT supports it for linear and Conv2D layers; it costs
            more compute than plain LoRA, so merge the adapter before inference.
        load_in_8bit (`bool`, *optional*, defaults to `False`):
            Load the base model's linear layers in 8 bits (bitsandbytes). Only trainable with an adapter
            (`use_peft`).
        load_in_4bit (`bool`, *optional*, defaults to `False`):
            Load the base model's linear layers in 4 bits (bitsandbytes), i.e. QLoRA with `use_peft`.
        bnb_4bit_quant_type (`str`, *optional*, defaults to `"nf4"`):
            The 4-bit data type: `"nf4"` (normal float) or `"fp4"`.
        use_bnb_nested_quant (`bool`, *optional*, defaults to `False`):
            Also quantize the quantization constants ("double quantization"), saving about 0.4 bits per weight.
        bnb_4bit_quant_storage (`str`, *optional*):
            The dtype the packed 4-bit weights are stored in (e.g. `"uint8"`, `"bfloat16"`); `None` is
            bitsandbytes' default (`uint8`).

    Raises:
        ValueError: from `__post_init__`, if both `load_in_8bit` and `load_in_4bit` are set.
    """

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "The model to train: a local save_pretrained folder or a Hub id."},
    )
    model_revision: str = field(
        default="main",
        metadata={"help": "Branch, tag or commit of a Hub model."},
    )
    dtype: str | None = field(
        default="float32",
        metadata={
            "help": "dtype to load the weights in ('auto' keeps the checkpoint's); float32 by default.",
            "choices": ["auto", "bfloat16", "float16", "float32"],
        },
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "Attention kernel, e.g. 'eager', 'sdpa', or 'flash_attention_2' (install flash-attn for it); "
            "unset lets transformers choose."
        },
    )
    use_peft: bool = field(default=False, metadata={"help": "Train a LoRA adapter instead of every weight."})
    lora_r: int = field(default=16, metadata={"help": "Rank of the LoRA matrices."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator (update × lora_alpha / lora_r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA input."})
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={"help": "Modules that get an adapter; one value (e.g. all-linear) is passed to PEFT as a string."},
    )
    lora_target_parameters: list[str] | None = field(
        default=None,
        metadata={"help": "Parameters (not modules) that get an adapter, e.g. MoE expert weights (PEFT >= 0.17)."},
    )
    lora_modules_to_save: list[str] | None = field(
        default=None,
        metadata={"help": "Modules trained in full and saved with the adapter."},
    )
    lora_task_type: str = field(
        default="CAUSAL_LM",
        metadata={"help": "PEFT task type of the adapter ('SEQ_CLS' for a reward model)."},
    )
    use_rslora: bool = field(
        default=False,
        metadata={"help": "Rank-stabilised LoRA: scale the update by lora_alpha/sqrt(r) instead of lora_alpha/r."},
    )
    use_dora: bool = field(
        default=False,
        metadata={
            "help": "Weight-decomposed LoRA (DoRA): learn a magnitude and a LoRA-trained direction of each update. "
            "Linear and Conv2D layers only; slower than LoRA, so merge the adapter for inference."
        },
    )
    load_in_8bit: bool = field(
        default=False,
        metadata={"help": "Load the base model in 8 bits (bitsandbytes); train it with --use_peft."},
    )
    load_in_4bit: bool = field(
        default=False,
        metadata={"help": "Load the base model in 4 bits (bitsandbytes); with --use_peft this is QLoRA."},
    )
    bnb_4bit_quant_type: str = field(
        default="nf4",
        metadata={"help": "4-bit data type.", "choices": ["fp4", "nf4"]},
    )
    use_bnb_nested_quant: bool = field(
        default=False,
        metadata={"help": "Double quantization: quantize the 4-bit quantization constants too."},
    )
    bnb_4bit_quant_storage: str | None = field(
        default=None,
        metadata={"help": "dtype that stores the packed 4-bit weights (bitsandbytes' default: uint8)."},
    )

    def __post_init__(self):
        if self.load_in_8bit and self.load_in_4bit:
            raise ValueError(
                "You can't use 8 bit and 4 bit precision at the same time: set only one of load_in_8bit and "
                "load_in_4bit."
            )
        # `--lora_target_modules all-linear` parses as ["all-linear"]; PEFT only reads the keyword in a plain string.
        if isinstance(self.lora_target_modules, (list, tuple)) and len(self.lora_target_modules) == 1:
            self.lora_target_modules = self.lora_target_modules[0]
